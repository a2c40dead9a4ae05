// Engine: the prefill/decode disaggregation half (kv_handoff.h) — remote-prefill
// leases on the decode side, pinned prefills on the prefill side, and their timeouts.
// The sequences themselves live in the Scheduler (kReceiving / kPrefilled); this file
// records every lease and export pin in the KvHandoffLedger (their one owner) and moves the bytes.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "kv/kv_layout.h"

namespace kvmesh::engine {

int64_t Engine::NowMs() const {
  if (now_ms_) return now_ms_();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t Engine::DeadlineAfter(int64_t timeout_ms) const {
  if (timeout_ms <= 0) return std::numeric_limits<int64_t>::max();
  const int64_t now = NowMs();
  return now > std::numeric_limits<int64_t>::max() - timeout_ms ? std::numeric_limits<int64_t>::max()
                                                                 : now + timeout_ms;
}

namespace {

// Why a runner with no host view of its KV (kv_rank_storages() empty) cannot transfer it.
absl::Status NoHostKv() {
  return absl::FailedPreconditionError(
      "the model runner exposes no host view of its KV, so its blocks cannot be transferred (a CUDA worker keeps "
      "a host mirror for transfers only with --role prefill or decode)");
}

}  // namespace

absl::StatusOr<kv::KvBlockSpec> Engine::kv_block_spec() const {
  if (!kv_layout_.has_value()) return absl::FailedPreconditionError("the model runner has no KV pool layout");
  return kv::KvBlockSpecOf(*kv_layout_);
}

absl::StatusOr<RemotePrefillLease> Engine::ReserveForRemotePrefill(EngineRequest request) {
  KVMESH_ASSIGN_OR_RETURN(const kv::KvBlockSpec spec, kv_block_spec());
  if (kv_ranks_.empty()) return NoHostKv();
  KVMESH_RETURN_IF_ERROR(ValidateEngineRequest(request, limits_));
  KVMESH_ASSIGN_OR_RETURN(RemotePrefillReservation reservation, scheduler_->ReserveRemotePrefill(request));
  // The transfer writes these blocks directly, between steps: offload what the
  // reservation evicted, and onboard its host hits, first.
  if (absl::Status copied = RunPendingTierCopies(); !copied.ok()) {
    // Its onboarded prefix never landed: the reservation must not stand.
    (void)scheduler_->FailRequest(request.request_id, copied);
    return absl::UnavailableError(absl::StrCat("KV tier copy failed: ", copied.message()));
  }
  const int32_t num_cached_blocks = reservation.num_cached_tokens / spec.block_size_tokens;
  const int64_t deadline_ms = DeadlineAfter(lease_timeout_ms_);
  // The ledger counts every rank's layers: (rank, layer) is its layer r * num_layers + layer.
  const KvTransferId id = handoffs_.Grant(request.request_id, reservation.block_ids, num_cached_blocks,
                                          spec.num_layers * kv_tp_size(), deadline_ms);
  RemotePrefillLease granted{.transfer_id = id,
                             .request_id = request.request_id,
                             .block_ids = std::move(reservation.block_ids),
                             .num_cached_tokens = reservation.num_cached_tokens,
                             .kv_spec = spec,
                             .tp_size = kv_tp_size(),
                             .deadline_ms = deadline_ms};
  if (request.on_output) callbacks_[request.request_id] = std::move(request.on_output);
  return granted;
}

absl::Status Engine::ImportKvBlock(KvTransferId transfer_id, int32_t rank, int32_t layer, int32_t block_index,
                                   std::span<const std::byte> data) {
  KVMESH_ASSIGN_OR_RETURN(kv::KvLease * lease, handoffs_.Find(transfer_id, NowMs(), "ImportKvBlock"));
  if (kv_ranks_.empty()) return NoHostKv();
  if (rank < 0 || rank >= kv_tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImportKvBlock: rank ", rank, " is outside this engine's ", kv_tp_size(), " ranks"));
  }
  kv::KvStorage* storage = kv_ranks_[static_cast<size_t>(rank)];
  const kv::KvLayout& layout = storage->layout();
  if (layer < 0 || layer >= layout.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImportKvBlock: layer ", layer, " is outside [0, ", layout.num_layers(), ")"));
  }
  const int32_t ledger_layer = rank * layout.num_layers() + layer;
  KVMESH_ASSIGN_OR_RETURN(const kv::BlockId target, handoffs_.ImportTarget(*lease, ledger_layer, block_index));
  if (static_cast<int64_t>(data.size()) != layout.BlockBytes()) {
    return absl::DataLossError(absl::StrCat("ImportKvBlock: got ", data.size(), " bytes for block ", block_index,
                                            " of layer ", layer, ", the layout's blocks have ",
                                            layout.BlockBytes()));
  }
  const std::span<std::byte> dst = storage->BlockData(layer, target);
  std::memcpy(dst.data(), data.data(), data.size());
  handoffs_.RecordImport(*lease, ledger_layer, block_index);
  return absl::OkStatus();
}

absl::StatusOr<RequestOutput> Engine::CommitRemotePrefill(KvTransferId transfer_id, int32_t first_token_id,
                                                          std::optional<SampleResult> first_token_logprobs) {
  KVMESH_ASSIGN_OR_RETURN(kv::KvLease * lease, handoffs_.Find(transfer_id, NowMs(), "CommitRemotePrefill"));
  const int64_t expected = lease->num_expected();
  // NOTE: a transport that writes the storage directly imports nothing; one that uses
  // ImportKvBlock must have sent every block, or the sequence would attend to garbage.
  if (lease->num_imported > 0 && lease->num_imported < expected) {
    return absl::FailedPreconditionError(absl::StrCat("CommitRemotePrefill: lease ", transfer_id.value, " imported ",
                                                      lease->num_imported, " of ", expected, " blocks"));
  }
  // The blocks landed in the runner's host view; a device pool takes them from there.
  std::vector<int32_t> landed;
  for (size_t b = static_cast<size_t>(lease->num_cached_blocks); b < lease->block_ids.size(); ++b) {
    landed.push_back(lease->block_ids[b].value);
  }
  if (absl::Status copied = runner_.CopyKvFromHostMirror(landed); !copied.ok()) {
    return absl::InternalError(absl::StrCat("CommitRemotePrefill: the landed KV could not be copied into the "
                                            "runner's pool: ", copied.message()));
  }
  const std::string request_id = lease->request_id;
  KVMESH_ASSIGN_OR_RETURN(RequestOutput output,
                          scheduler_->CommitRemotePrefill(request_id, first_token_id, first_token_logprobs));
  CloseLease(transfer_id, kv::KvHandoffLedger::LeaseEnd::kCommitted);
  if (!output.outputs.empty() || output.finished) Deliver({output});
  return output;
}

absl::StatusOr<RequestOutput> Engine::FailRemotePrefill(KvTransferId transfer_id, absl::Status status) {
  if (status.ok()) return absl::InvalidArgumentError("FailRemotePrefill needs the error that failed the transfer");
  const kv::KvLease* lease = handoffs_.lease(transfer_id);
  if (lease == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("FailRemotePrefill: no open KV transfer lease ",
                                                      transfer_id.value));
  }
  const std::string request_id = lease->request_id;
  KVMESH_ASSIGN_OR_RETURN(RequestOutput output, scheduler_->FailRequest(request_id, status));
  CloseLease(transfer_id, kv::KvHandoffLedger::LeaseEnd::kFailed);
  Deliver({output});
  return output;
}

absl::Status Engine::FallBackToLocalPrefill(KvTransferId transfer_id, const absl::Status& why) {
  const kv::KvLease* lease = handoffs_.lease(transfer_id);
  if (lease == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("FallBackToLocalPrefill: no open KV transfer lease ",
                                                      transfer_id.value, " (", why.message(), ")"));
  }
  const std::string request_id = lease->request_id;
  KVMESH_RETURN_IF_ERROR(scheduler_->RequeueRemotePrefill(request_id));
  CloseLease(transfer_id, kv::KvHandoffLedger::LeaseEnd::kFailed);
  ++num_remote_prefill_fallbacks_;
  return absl::OkStatus();
}

void Engine::ExpectDirectKvWrites(KvTransferId transfer_id) { handoffs_.ExpectDirectWrites(transfer_id); }

void Engine::KvWritersGone(KvTransferId transfer_id) {
  const std::vector<kv::BlockId> released = handoffs_.WritersGone(transfer_id);
  if (released.empty()) return;
  if (const absl::Status s = kv_->ReleaseHeldBlocks(released); !s.ok()) {
    KVMESH_LOG(kError) << "releasing quarantined KV blocks failed" << LogKv("status", s.ToString());
  }
}

void Engine::CloseLease(KvTransferId id, kv::KvHandoffLedger::LeaseEnd end) {
  // NOTE: the request's table may have freed these blocks already (in this same engine
  // call: nothing allocated them since); HoldBlocks takes them back out of the pool.
  // A quarantine is stranded once it lasted a whole lease timeout: a live writer is
  // refused at its next message and says it stopped long before.
  const std::vector<kv::BlockId> quarantined = handoffs_.Close(id, end, DeadlineAfter(lease_timeout_ms_));
  if (quarantined.empty()) return;
  if (const absl::Status s = kv_->HoldBlocks(quarantined); !s.ok()) {
    KVMESH_LOG(kError) << "quarantining KV blocks failed" << LogKv("status", s.ToString());
  }
}

absl::StatusOr<std::vector<RequestOutput>> Engine::HandBackUnstarted(const absl::Status& status) {
  if (status.ok()) return absl::InvalidArgumentError("HandBackUnstarted needs the status the requests end with");
  std::vector<RequestOutput> outputs;
  for (const std::string& id : scheduler_->UnstartedRequests()) {
    absl::StatusOr<RequestOutput> out = scheduler_->FailRequest(id, status);
    if (out.ok()) outputs.push_back(*std::move(out));
  }
  Deliver(outputs);
  return outputs;
}

absl::Status Engine::AddPrefillOnlyRequest(EngineRequest request, int32_t skip_leading_tokens,
                                           KvLayerSink on_layer_blocks) {
  if (on_layer_blocks && kv_ranks_.empty()) return NoHostKv();
  KVMESH_RETURN_IF_ERROR(ValidateEngineRequest(request, limits_));
  const int32_t block_size = limits_.block_size_tokens;
  const int32_t prompt_len = static_cast<int32_t>(request.prompt_token_ids.size());
  if (skip_leading_tokens < 0 || skip_leading_tokens % block_size != 0 || skip_leading_tokens >= prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat("skip_leading_tokens ", skip_leading_tokens,
                                                   " must be a multiple of the block size ", block_size,
                                                   " in [0, ", prompt_len, ")"));
  }
  std::function<void(const RequestOutput&)> callback = std::move(request.on_output);
  request.on_output = nullptr;
  KVMESH_RETURN_IF_ERROR(scheduler_->AddPrefillOnlyRequest(request, skip_leading_tokens / block_size));
  if (callback) callbacks_[request.request_id] = std::move(callback);
  if (on_layer_blocks) {
    streamed_prefills_[request.request_id] =
        StreamedPrefill{.kv_id = *scheduler_->FirstSequenceKvId(request.request_id),
                        .sink = std::move(on_layer_blocks),
                        .num_prompt_tokens = prompt_len,
                        .next_block = skip_leading_tokens / block_size};
  }
  return absl::OkStatus();
}

std::vector<Engine::LayerExport> Engine::PlanLayerExports(const SchedulerOutput& scheduled) {
  std::vector<LayerExport> plan;
  const int32_t block_size = limits_.block_size_tokens;
  for (auto& [request_id, stream] : streamed_prefills_) {
    for (size_t i = 0; i < scheduled.chunks.size(); ++i) {
      const ScheduledChunk& chunk = scheduled.chunks[i];
      if (chunk.kv_id != stream.kv_id) continue;
      // A block is final once the chunk covers all its positions, or the prompt ends in it.
      const int32_t end = chunk.start_position + chunk.num_tokens;
      const int32_t num_final = end >= stream.num_prompt_tokens ? (stream.num_prompt_tokens + block_size - 1) / block_size
                                                                : end / block_size;
      if (num_final <= stream.next_block) break;
      // NOTE: a recompute after preemption writes the same bytes into new blocks; what
      // went out before stays valid, so next_block never moves back.
      // The KV manager's table: the batch's chunk may carry only its tail.
      const std::span<const kv::BlockId> table = kv_->block_table(chunk.kv_id);
      LayerExport& e = plan.emplace_back();
      e.sink = &stream.sink;
      e.first_block_index = stream.next_block;
      for (int32_t b = stream.next_block; b < num_final; ++b) e.block_ids.push_back(table[static_cast<size_t>(b)]);
      stream.next_block = num_final;
      break;
    }
  }
  return plan;
}

void Engine::ExportLayer(const std::vector<LayerExport>& plan, int32_t layer) {
  std::vector<std::span<const std::byte>> spans;
  for (const LayerExport& e : plan) {
    for (size_t rank = 0; rank < kv_ranks_.size(); ++rank) {
      spans.clear();
      for (const kv::BlockId id : e.block_ids) spans.push_back(kv_ranks_[rank]->BlockData(layer, id));
      (*e.sink)(KvLayerBlocks{.rank = static_cast<int32_t>(rank),
                              .layer = layer,
                              .first_block_index = e.first_block_index,
                              .blocks = spans});
    }
  }
}

absl::Status Engine::MakePrefillExportable(const std::string& request_id, const PrefillResult& result) {
  const auto it = streamed_prefills_.find(request_id);
  if (it == streamed_prefills_.end()) {
    // Exported after the fact (ExportKvBlock) from the runner's host view: all of it.
    std::vector<int32_t> blocks;
    for (const kv::BlockId id : result.block_ids) blocks.push_back(id.value);
    return runner_.CopyKvToHostMirror(blocks);
  }
  const StreamedPrefill stream = std::move(it->second);
  streamed_prefills_.erase(it);
  const int32_t num_blocks = static_cast<int32_t>(result.block_ids.size());
  if (stream.next_block >= num_blocks) return absl::OkStatus();
  LayerExport rest{.sink = &stream.sink, .first_block_index = stream.next_block, .block_ids = {}};
  rest.block_ids.assign(result.block_ids.begin() + stream.next_block, result.block_ids.end());
  std::vector<int32_t> blocks;
  for (const kv::BlockId id : rest.block_ids) blocks.push_back(id.value);
  KVMESH_RETURN_IF_ERROR(runner_.CopyKvToHostMirror(blocks));
  for (int32_t layer = 0; layer < kv_layout_->num_layers(); ++layer) ExportLayer({rest}, layer);
  return absl::OkStatus();
}

absl::StatusOr<std::span<const std::byte>> Engine::ExportKvBlock(const std::string& request_id, int32_t rank,
                                                                 int32_t layer, int32_t block_index) const {
  const kv::KvExportPin* pin = handoffs_.pin(request_id);
  if (pin == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ExportKvBlock: request '", request_id, "' is not a computed prefill-only request (unknown, not yet "
        "computed, or ended)"));
  }
  if (kv_ranks_.empty()) return NoHostKv();
  if (rank < 0 || rank >= kv_tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportKvBlock: rank ", rank, " is outside this engine's ", kv_tp_size(), " ranks"));
  }
  const kv::KvStorage* storage = kv_ranks_[static_cast<size_t>(rank)];
  const int32_t num_blocks = static_cast<int32_t>(pin->block_ids.size());
  if (layer < 0 || layer >= storage->layout().num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportKvBlock: layer ", layer, " is outside [0, ", storage->layout().num_layers(), ")"));
  }
  if (block_index < 0 || block_index >= num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportKvBlock: block ", block_index, " is outside the prefill's ", num_blocks, " blocks"));
  }
  return storage->BlockData(layer, pin->block_ids[static_cast<size_t>(block_index)]);
}

absl::StatusOr<RequestOutput> Engine::ReleasePrefill(const std::string& request_id) {
  KVMESH_ASSIGN_OR_RETURN(RequestOutput output, scheduler_->ReleasePrefill(request_id));
  Deliver({output});
  return output;
}

std::vector<RequestOutput> Engine::ReclaimExpired() {
  std::vector<RequestOutput> outputs;
  if (handoffs_.empty()) return outputs;
  const int64_t now = NowMs();
  // Collected first (ending a request edits the ledger), in a deterministic order.
  for (const KvTransferId id : handoffs_.ExpiredLeases(now)) {
    const std::string request_id = handoffs_.lease(id)->request_id;
    CloseLease(id, kv::KvHandoffLedger::LeaseEnd::kExpired);
    absl::StatusOr<RequestOutput> out = scheduler_->FailRequest(
        request_id, absl::DeadlineExceededError(absl::StrCat("KV transfer lease ", id.value, " expired after ",
                                                             lease_timeout_ms_, " ms without a commit")));
    if (out.ok()) outputs.push_back(*std::move(out));  // else already ended: nothing to free
  }
  for (const std::string& request_id : handoffs_.ExpiredPins(now)) {
    handoffs_.Unpin(request_id, /*expired=*/true);
    absl::StatusOr<RequestOutput> out = scheduler_->FailRequest(
        request_id, absl::DeadlineExceededError(absl::StrCat("prefill of '", request_id, "' was not released within ",
                                                             prefill_release_timeout_ms_, " ms")));
    if (out.ok()) outputs.push_back(*std::move(out));
  }
  Deliver(outputs);
  return outputs;
}

}  // namespace kvmesh::engine
