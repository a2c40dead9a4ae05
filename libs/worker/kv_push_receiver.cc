#include "worker/kv_push_receiver.h"

#include <xxhash.h>

#include <memory>
#include <span>

#include "absl/strings/str_cat.h"
#include "rpc/status_conversion.h"

namespace kvmesh::worker {

KvPushReceiver::KvPushReceiver(WorkerState& state, v1::KvPushAck* ack)
    : state_(state), ack_(ack), start_(std::chrono::steady_clock::now()) {
  StartRead(&chunk_);
}

void KvPushReceiver::OnReadDone(bool ok) {
  if (!ok) {
    std::unique_lock<std::mutex> lock(mu_);
    reading_done_ = true;
    MaybeFinishLocked(lock);
    return;
  }
  const absl::Status s = Accept(chunk_);
  std::unique_lock<std::mutex> lock(mu_);
  if (!s.ok()) {
    if (error_.ok()) error_ = s;
    reading_done_ = true;
    MaybeFinishLocked(lock);
    return;
  }
  lock.unlock();
  StartRead(&chunk_);
}

void KvPushReceiver::OnCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = absl::CancelledError("the sender cancelled the KV push");
}

absl::Status KvPushReceiver::Accept(const v1::KvBlockChunk& chunk) {
  const std::string& payload = chunk.payload();
  if (XXH64(payload.data(), payload.size(), 0) != chunk.checksum_xxh64()) {
    return absl::DataLossError(absl::StrCat("KV chunk ", chunk.sequence(), " of transfer ", chunk.transfer_id(),
                                            ": checksum mismatch"));
  }
  std::optional<WorkerState::Lease> lease = state_.FindLease(chunk.transfer_id());
  if (!lease) return absl::NotFoundError(absl::StrCat("unknown KV transfer '", chunk.transfer_id(), "'"));
  if (chunk.rank() < 0 || chunk.rank() >= state_.tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", chunk.rank(), ": this worker has ", state_.tp_size(), " tensor-parallel ranks"));
  }
  const int64_t block_bytes = state_.block_spec().block_bytes;
  if (static_cast<int64_t>(payload.size()) != block_bytes * chunk.block_ids_size()) {
    return absl::DataLossError(absl::StrCat("KV chunk of ", payload.size(), " bytes for ", chunk.block_ids_size(),
                                            " blocks of ", block_bytes, " bytes"));
  }
  auto indices = std::make_shared<std::vector<int32_t>>();
  for (int32_t block : chunk.block_ids()) {
    const auto it = lease->index_of_block.find(block);
    if (it == lease->index_of_block.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", block, " is not a destination block of transfer ", chunk.transfer_id()));
    }
    indices->push_back(it->second);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++num_chunks_;
    num_bytes_ += static_cast<int64_t>(payload.size());
    if (chunk.last()) committed_.push_back(chunk.transfer_id());
    if (indices->empty()) return absl::OkStatus();  // a bare end-of-transfer marker
    ++pending_;
  }
  if (KvTransferMetrics* m = state_.transfer_metrics()) {
    m->AddBytes(KvTransferMetrics::Direction::kReceived, static_cast<int64_t>(payload.size()));
  }
  auto data = std::make_shared<std::string>(payload);
  const engine::KvTransferId id = lease->id;
  const int32_t rank = chunk.rank();
  const int32_t layer = chunk.layer();
  state_.engine().Post([this, id, rank, layer, indices, data, block_bytes](engine::Engine& e) {
    absl::Status s;
    for (size_t i = 0; i < indices->size() && s.ok(); ++i) {
      s = e.ImportKvBlock(id, rank, layer, (*indices)[i],
                          std::span<const std::byte>(reinterpret_cast<const std::byte*>(data->data()) + i * block_bytes,
                                                     static_cast<size_t>(block_bytes)));
    }
    std::unique_lock<std::mutex> lock(mu_);
    --pending_;
    if (!s.ok() && error_.ok()) error_ = s;
    MaybeFinishLocked(lock);
  });
  return absl::OkStatus();
}

void KvPushReceiver::MaybeFinishLocked(std::unique_lock<std::mutex>& lock) {
  if (!reading_done_ || pending_ > 0 || finished_) return;
  finished_ = true;
  for (const std::string& id : committed_) ack_->add_committed_transfer_ids(id);
  ack_->set_num_chunks(num_chunks_);
  ack_->set_num_bytes(num_bytes_);
  const absl::Status s = error_;
  lock.unlock();
  if (KvTransferMetrics* m = state_.transfer_metrics()) {
    m->EndStream(KvTransferMetrics::Direction::kReceived,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(), s.ok());
  }
  Finish(rpc::ToGrpcStatus(s));
}

}  // namespace kvmesh::worker
