// KvPushReceiver: the decode side of Worker.PushKvBlocks, a server read reactor. Each
// chunk is checked — XXH64 of its payload (DATA_LOSS), its transfer among the open
// leases (NOT_FOUND), rank and size (INVALID_ARGUMENT / DATA_LOSS), every block id a
// destination block of that transfer (INVALID_ARGUMENT) — and its blocks are imported
// on the engine thread (Engine::ImportKvBlock, whose errors end the stream too). The
// first error ends the stream; it answers once every posted import has run, so a
// Prefill reply that follows a successful push always follows its imports.
//
// Ownership: deletes itself in OnDone. Thread-safety: gRPC and engine-thread callbacks
// synchronize on mu_; nothing is held across a reactor call.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

class KvPushReceiver : public grpc::ServerReadReactor<v1::KvBlockChunk> {
 public:
  // `state` must outlive the call; `ack` is the call's response.
  KvPushReceiver(WorkerState& state, v1::KvPushAck* ack);

  void OnReadDone(bool ok) override;
  // The sender went away (or cancelled): the stream counts as a failed transfer.
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  // Checks one chunk and posts its imports.
  absl::Status Accept(const v1::KvBlockChunk& chunk);
  void MaybeFinishLocked(std::unique_lock<std::mutex>& lock);

  WorkerState& state_;
  v1::KvPushAck* ack_;
  v1::KvBlockChunk chunk_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  int pending_ = 0;
  bool reading_done_ = false;
  bool finished_ = false;
  absl::Status error_;
  std::vector<std::string> committed_;
  int64_t num_chunks_ = 0;
  int64_t num_bytes_ = 0;
};

}  // namespace kvmesh::worker
