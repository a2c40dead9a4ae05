#include "worker/kv_push_stream.h"

#include <xxhash.h>

#include <optional>
#include <utility>

#include "rpc/channel.h"
#include "rpc/status_conversion.h"

namespace kvmesh::worker {

absl::StatusOr<std::shared_ptr<KvPushStream>> KvPushStream::Start(const std::shared_ptr<grpc::Channel>& channel,
                                                                  std::string transfer_id, int64_t timeout_ms,
                                                                  DoneFn on_done, OutgoingCalls* calls) {
  std::shared_ptr<KvPushStream> stream(new KvPushStream(std::move(transfer_id), std::move(on_done)));
  if (calls != nullptr) {
    const std::optional<OutgoingCalls::CallId> id = calls->Begin([stream] { stream->Cancel(); });
    if (!id.has_value()) return absl::UnavailableError("the worker is stopping");
    stream->calls_ = calls;
    stream->call_id_ = *id;
  }
  stream->self_ = stream;
  stream->stub_ = v1::Worker::NewStub(channel);
  if (timeout_ms > 0) rpc::SetTimeout(&stream->context_, timeout_ms);
  stream->stub_->async()->PushKvBlocks(&stream->context_, &stream->ack_, stream.get());
  stream->StartCall();
  return stream;
}

void KvPushStream::Write(v1::KvBlockChunk chunk) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_ || broken_) return;
  chunk.set_sequence(next_sequence_++);
  queue_.push_back(std::move(chunk));
  Pump(std::move(lock));
}

void KvPushStream::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  if (broken_) return;
  // NOTE: the receiver reads `last` as "this transfer is complete"; when everything has
  // been written already, an empty chunk carries it.
  if (queue_.empty()) {
    v1::KvBlockChunk& end = queue_.emplace_back();
    end.set_sequence(next_sequence_++);
    end.set_transfer_id(transfer_id_);
  }
  queue_.back().set_last(true);
  Pump(std::move(lock));
}

void KvPushStream::Pump(std::unique_lock<std::mutex> lock) {
  if (writing_ || broken_ || writes_done_) return;
  if (!queue_.empty()) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    bytes_written_ += static_cast<int64_t>(current_.payload().size());
    lock.unlock();
    // current_ is ours until OnWriteDone: hashing it outside the lock is safe.
    current_.set_checksum_xxh64(XXH64(current_.payload().data(), current_.payload().size(), 0));
    StartWrite(&current_);
    return;
  }
  if (closed_) {
    writes_done_ = true;
    lock.unlock();
    StartWritesDone();
  }
}

void KvPushStream::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) {
    // The stream broke (the receiver finished early, or it was cancelled): OnDone brings
    // the status.
    broken_ = true;
    queue_.clear();
    return;
  }
  Pump(std::move(lock));
}

void KvPushStream::OnDone(const grpc::Status& status) {
  int64_t bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = bytes_written_;
  }
  // The callback is moved out, so its captures die with this call: they hold the
  // stream's owner (a prefill job holds its stream), and a stream that kept them would
  // keep itself and its owner alive forever.
  DoneFn on_done = std::move(on_done_);
  // NOTE: releasing these two may delete this; nothing touches the object afterwards.
  std::shared_ptr<KvPushStream> self = std::move(self_);
  OutgoingCalls* const calls = calls_;
  const OutgoingCalls::CallId call_id = call_id_;
  on_done(rpc::FromGrpcStatus(status), ack_, bytes);
  on_done = nullptr;  // its captures (the owner, which uses the WorkerState) go first
  if (calls != nullptr) calls->End(call_id);
}

}  // namespace kvmesh::worker
