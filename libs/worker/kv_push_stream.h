// KvPushStream: the sending half of one KV transfer over Worker.PushKvBlocks, as a gRPC
// client write reactor: no thread of its own, whatever the number of transfers in flight.
// Chunks queued from any thread (the engine thread, between two layers) go out in order,
// one write at a time; the XXH64 of each payload is taken just before its write, off the
// queueing thread when a write is already in flight. Close() ends the stream once the
// queue has drained (the last chunk carries `last`); the receiver then answers after
// every import ran, and `on_done` gets its status.
//
// Ownership: Start returns a shared handle; the stream also holds itself until gRPC is
// done with it (OnDone), so dropping the handle early is safe.
// Thread-safety: thread-safe. on_done runs once, on a gRPC thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/outgoing_calls.h"

namespace kvmesh::worker {

class KvPushStream : public grpc::ClientWriteReactor<v1::KvBlockChunk> {
 public:
  // The stream's final status (the receiver's: DATA_LOSS, NOT_FOUND, ...; CANCELLED after
  // Cancel; DEADLINE_EXCEEDED past timeout_ms), its ack, and the payload bytes written.
  using DoneFn = std::function<void(const absl::Status& status, const v1::KvPushAck& ack, int64_t bytes_written)>;

  // Opens the stream of transfer `transfer_id` on `channel`; timeout_ms <= 0: none. With
  // `calls` (which must outlive the stream), the stream is registered there until its
  // on_done has run; Unavailable when `calls` is stopping (nothing is opened).
  static absl::StatusOr<std::shared_ptr<KvPushStream>> Start(const std::shared_ptr<grpc::Channel>& channel,
                                                             std::string transfer_id, int64_t timeout_ms,
                                                             DoneFn on_done, OutgoingCalls* calls = nullptr);

  // Queues a chunk; its sequence, checksum and `last` are set here. Dropped after Close,
  // Cancel or a failed write.
  void Write(v1::KvBlockChunk chunk);
  // No more chunks: finishes the stream after the queued ones.
  void Close();
  // Abandons the stream (the receiver sees it cancelled); on_done follows.
  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override { (void)ok; }
  void OnDone(const grpc::Status& status) override;

 private:
  KvPushStream(std::string transfer_id, DoneFn on_done)
      : transfer_id_(std::move(transfer_id)), on_done_(std::move(on_done)) {}
  // Starts the next write (or WritesDone) unless one is in flight. Releases `lock`.
  void Pump(std::unique_lock<std::mutex> lock);

  grpc::ClientContext context_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  v1::KvPushAck ack_;
  const std::string transfer_id_;
  DoneFn on_done_;  // moved out (and so dropped) by OnDone
  std::shared_ptr<KvPushStream> self_;  // until OnDone
  OutgoingCalls* calls_ = nullptr;      // set in Start
  OutgoingCalls::CallId call_id_ = 0;   // set in Start

  std::mutex mu_;
  std::deque<v1::KvBlockChunk> queue_;
  v1::KvBlockChunk current_;  // the write in flight
  bool writing_ = false;
  bool closed_ = false;       // Close() called
  bool writes_done_ = false;  // StartWritesDone() called
  bool broken_ = false;       // a write failed: the stream is over
  uint32_t next_sequence_ = 0;
  int64_t bytes_written_ = 0;
};

}  // namespace kvmesh::worker
