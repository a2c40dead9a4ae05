#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

// What a request failed by the runner reports. A runner's InvalidArgument means the
// engine built a malformed batch (an engine bug, not the client's input): Internal, so
// that no service turns it into a 400.
absl::Status RunnerError(const absl::Status& s) {
  const absl::StatusCode code =
      s.code() == absl::StatusCode::kInvalidArgument ? absl::StatusCode::kInternal : s.code();
  return absl::Status(code, absl::StrCat("model runner failed: ", s.message()));
}

}  // namespace

namespace {

// Builds the lower tiers the options ask for under `kv` (nothing when host_cache_bytes is 0).
absl::Status AttachKvTiers(const EngineOptions& options, ModelRunner& runner, kv::KvCacheManager& kv) {
  const EngineKvTierOptions& t = options.tiers;
  if (t.host_cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-host-cache-bytes must be >= 0, got ", t.host_cache_bytes));
  }
  if (t.host_cache_bytes == 0) {
    if (!t.disk_cache_dir.empty()) {
      return absl::InvalidArgumentError(
          "--kv-disk-cache-dir needs --kv-host-cache-bytes: blocks read from disk land in the host tier");
    }
    if (t.make_connectors) {
      return absl::InvalidArgumentError(
          "--kv-store needs --kv-host-cache-bytes: blocks read from the store land in the host tier");
    }
    return absl::OkStatus();
  }
  if (!options.kv.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "--kv-host-cache-bytes needs prefix caching: offloaded blocks are found again by their hashes");
  }
  const int64_t slot_bytes = runner.kv_swap_bytes_per_block();
  if (slot_bytes <= 0) {
    return absl::FailedPreconditionError(
        "--kv-host-cache-bytes: this model runner cannot copy KV blocks to host memory (tensor-parallel or device "
        "runners without block swaps)");
  }
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv::HostKvTier> host,
                          kv::HostKvTier::Create({.capacity_bytes = t.host_cache_bytes,
                                                  .slot_bytes = slot_bytes,
                                                  .allocate = t.host_allocate,
                                                  .deallocate = t.host_deallocate,
                                                  .record_events = options.kv.record_events}));
  std::vector<std::unique_ptr<kv::KvConnector>> connectors;
  const KvSlotShape shape = runner.kv_slot_shape();
  if ((!t.disk_cache_dir.empty() || t.make_connectors) &&
      static_cast<int64_t>(shape.num_layers) * shape.block_bytes != slot_bytes) {
    return absl::InternalError(absl::StrCat("lower KV tiers: the runner's slot shape (", shape.num_layers, " x ",
                                            shape.block_bytes, " bytes) is not its ", slot_bytes,
                                            "-byte swap unit"));
  }
  if (!t.disk_cache_dir.empty()) {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv::DiskKvTier> disk,
                            kv::DiskKvTier::Create({.directory = t.disk_cache_dir,
                                                    .capacity_bytes = t.disk_cache_bytes,
                                                    .record_payload_bytes = slot_bytes,
                                                    .salt = t.model_identity ^ options.kv.salt,
                                                    .num_layers = shape.num_layers,
                                                    .block_bytes = shape.block_bytes,
                                                    .dtype = shape.dtype,
                                                    .block_size_tokens = runner.block_size_tokens()}));
    connectors.push_back(std::move(disk));
  }
  if (t.make_connectors) {
    KVMESH_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<kv::KvConnector>> more, t.make_connectors(shape, slot_bytes));
    for (std::unique_ptr<kv::KvConnector>& c : more) connectors.push_back(std::move(c));
  }
  auto tiers = std::make_unique<kv::KvTiers>(std::move(host), std::move(connectors), kv.block_size_tokens(),
                                             options.kv.record_events);
  tiers->set_write_through(options.tiers.write_through);
  tiers->set_swap_ins_verified_by_copy(runner.verifies_swap_ins());
  return kv.AttachTiers(std::move(tiers));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, ModelRunner& runner) {
  if (options.max_model_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len must be at least 1, got ", options.max_model_len));
  }
  KVMESH_RETURN_IF_ERROR(options.scheduler.Validate());
  if (options.kv.block_size_tokens != runner.block_size_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("KV block size ", options.kv.block_size_tokens,
                                                   " differs from the model runner's ", runner.block_size_tokens()));
  }
  kv::KvCacheManagerOptions kv_options = options.kv;
  if (kv_options.num_blocks == 0) kv_options.num_blocks = runner.num_blocks();
  if (kv_options.num_blocks > runner.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("num_blocks ", kv_options.num_blocks,
                                                   " exceeds the model runner's ", runner.num_blocks()));
  }
  if (!options.scheduler.enable_chunked_prefill &&
      options.scheduler.max_num_batched_tokens < options.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens (", options.scheduler.max_num_batched_tokens, ") is smaller than max_model_len (",
        options.max_model_len, "): without chunked prefill a long prompt could never be scheduled"));
  }
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv::KvCacheManager> kv, kv::KvCacheManager::Create(kv_options));
  KVMESH_RETURN_IF_ERROR(AttachKvTiers(options, runner, *kv));
  SchedulerOptions scheduler_options = options.scheduler;
  scheduler_options.argmax_on_runner = runner.returns_argmax();
  scheduler_options.runner_keeps_block_tables = runner.keeps_block_tables();
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                          Scheduler::Create(scheduler_options, *kv, runner.vocab_size()));
  const RequestLimits limits{.vocab_size = runner.vocab_size(),
                             .max_model_len = options.max_model_len,
                             .max_num_seqs = options.scheduler.max_num_seqs,
                             .num_kv_blocks = kv->num_blocks(),
                             .block_size_tokens = kv->block_size_tokens(),
                             .max_logprobs = options.max_logprobs,
                             .prompt_logprobs_supported = runner.all_position_logits()};
  return std::unique_ptr<Engine>(new Engine(options, runner, std::move(kv), std::move(scheduler), limits));
}

Engine::Engine(const EngineOptions& options, ModelRunner& runner, std::unique_ptr<kv::KvCacheManager> kv,
               std::unique_ptr<Scheduler> scheduler, const RequestLimits& limits)
    : runner_(runner),
      kv_ranks_(runner.kv_rank_storages()),
      kv_layout_(runner.kv_pool_layout()),
      kv_(std::move(kv)),
      scheduler_(std::move(scheduler)),
      limits_(limits),
      lease_timeout_ms_(options.lease_timeout_ms),
      prefill_release_timeout_ms_(options.prefill_release_timeout_ms),
      now_ms_(options.now_ms) {}

absl::Status Engine::AddRequest(EngineRequest request) {
  KVMESH_RETURN_IF_ERROR(ValidateEngineRequest(request, limits_));
  std::function<void(const RequestOutput&)> callback = std::move(request.on_output);
  request.on_output = nullptr;
  KVMESH_RETURN_IF_ERROR(scheduler_->AddRequest(request));
  if (callback) callbacks_[request.request_id] = std::move(callback);
  return absl::OkStatus();
}

absl::StatusOr<RequestOutput> Engine::Abort(const std::string& request_id) {
  KVMESH_ASSIGN_OR_RETURN(RequestOutput output, scheduler_->Abort(request_id));
  Deliver({output});
  return output;
}

absl::StatusOr<std::vector<RequestOutput>> Engine::Step() {
  std::vector<RequestOutput> reclaimed = ReclaimExpired();
  kv_->PollTiers();  // disk reads that landed make their requests admissible
  KVMESH_ASSIGN_OR_RETURN(SchedulerOutput scheduled, scheduler_->Schedule());
  if (scheduled.empty()) return reclaimed;
  if (!scheduled.chunks.empty()) ++num_steps_;
  // NOTE: the per-layer hook is installed only when a streamed prefill runs in this
  // step; ordinary steps leave it empty.
  std::vector<LayerExport> layer_exports;
  if (!streamed_prefills_.empty()) layer_exports = PlanLayerExports(scheduled);
  if (!layer_exports.empty()) {
    scheduled.batch.on_layer_kv_written = [this, &layer_exports](int32_t layer) { ExportLayer(layer_exports, layer); };
    for (const LayerExport& e : layer_exports) {
      for (const kv::BlockId id : e.block_ids) scheduled.batch.layer_kv_read_blocks.push_back(id.value);
    }
  }
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<ModelOutput> result = runner_.Execute(scheduled.batch);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  scheduled.batch.on_layer_kv_written = nullptr;
  scheduled.batch.layer_kv_read_blocks.clear();
  // NOTE: a failed step may have run none of its copies: offloads are dropped (the
  // blocks were evicted anyway) and onboarded blocks end with their failed requests.
  FinishSwaps(scheduled.swaps, result);
  if (result.ok() && result->swap_in_mismatch) {
    // A corrupt host block reached tier 0 and the runner stopped before using it: run
    // the step's sequences again (the host tier dropped the block: it is recomputed).
    // The layers planned for export this step never went out.
    for (const LayerExport& e : layer_exports) {
      for (auto& [request_id, stream] : streamed_prefills_) {
        if (&stream.sink == e.sink) stream.next_block = std::min(stream.next_block, e.first_block_index);
      }
    }
    ++num_swap_in_retries_;
    if (absl::Status retried = scheduler_->RetryScheduled(scheduled); !retried.ok()) return retried;
    return reclaimed;
  }
  if (result.ok()) RecordStepSpeed(scheduled, *result, seconds);
  if (result.ok()) {
    const size_t expected = static_cast<size_t>(scheduled.num_logits_rows) * static_cast<size_t>(limits_.vocab_size);
    if (result->logits.size() != expected) {
      result = absl::InternalError(absl::StrCat("returned ", result->logits.size(), " logits, expected ",
                                                scheduled.num_logits_rows, " rows of ", limits_.vocab_size));
    } else if (result->argmax_token_ids.size() != static_cast<size_t>(scheduled.num_argmax_rows)) {
      result = absl::InternalError(absl::StrCat("returned ", result->argmax_token_ids.size(),
                                                " argmax tokens, expected ", scheduled.num_argmax_rows));
    }
  }
  std::vector<RequestOutput> outputs;
  if (!result.ok()) {
    ++num_runner_failures_;
    outputs = scheduler_->FailScheduled(scheduled, RunnerError(result.status()));
  } else {
    KVMESH_ASSIGN_OR_RETURN(
        outputs, scheduler_->UpdateFromOutput(scheduled, result->logits, result->argmax_token_ids));
  }
  Deliver(outputs);
  if (reclaimed.empty()) return outputs;
  reclaimed.insert(reclaimed.end(), std::make_move_iterator(outputs.begin()), std::make_move_iterator(outputs.end()));
  return reclaimed;
}

void Engine::Deliver(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& delivered : outputs) {
    const RequestOutput* out = &delivered;
    std::optional<RequestOutput> failed;  // replaces a prefill whose KV cannot be exported
    if (out->prefill_result.has_value()) {
      if (absl::Status exportable = MakePrefillExportable(out->request_id, *out->prefill_result); exportable.ok()) {
        handoffs_.Pin(out->request_id, out->prefill_result->block_ids, DeadlineAfter(prefill_release_timeout_ms_));
      } else if (absl::StatusOr<RequestOutput> ended = scheduler_->FailRequest(out->request_id, exportable);
                 ended.ok()) {
        // Never handed out: a decode worker would read KV that is not there.
        failed = *std::move(ended);
        out = &*failed;
      }
    }
    const RequestOutput& output = *out;
    if (output.finished) {
      handoffs_.Unpin(output.request_id);
      streamed_prefills_.erase(output.request_id);
      // Commit, fail and expiry close their lease themselves: what is left was aborted.
      if (const KvTransferId* lease = handoffs_.LeaseOf(output.request_id); lease != nullptr) {
        CloseLease(*lease, kv::KvHandoffLedger::LeaseEnd::kAborted);
      }
    }
    const auto it = callbacks_.find(output.request_id);
    if (it == callbacks_.end()) continue;
    it->second(output);
    if (output.finished) callbacks_.erase(it);
  }
}

absl::Status Engine::RunPendingTierCopies() {
  if (!kv_->has_tiers()) return absl::OkStatus();
  const kv::KvSwaps swaps = kv_->TakeSwaps();
  if (swaps.empty()) return absl::OkStatus();
  ModelBatch batch;
  AppendSwaps(swaps, &batch);
  absl::StatusOr<ModelOutput> result = runner_.Execute(batch);
  FinishSwaps(swaps, result);
  if (result.ok() && result->swap_in_mismatch) {
    return absl::DataLossError("a host-tier KV block failed its checksum as it was onboarded (dropped: a retry "
                               "recomputes it)");
  }
  return result.status();
}

void Engine::FinishSwaps(const kv::KvSwaps& swaps, const absl::StatusOr<ModelOutput>& result) {
  if (!result.ok()) {
    kv_->FinishSwaps(swaps, /*copied=*/false, 0, 0, {});
    return;
  }
  kv_->FinishSwaps(swaps, /*copied=*/true, result->swap_out_seconds, result->swap_in_seconds,
                   result->swap_out_checksums, result->swap_in_checksums);
}

void Engine::RecordStepSpeed(const SchedulerOutput& scheduled, const ModelOutput& output, double seconds) {
  int64_t prefill_tokens = 0;
  for (const ScheduledChunk& c : scheduled.chunks) prefill_tokens += c.num_tokens > 1 ? c.num_tokens : 0;
  // Only prefill-heavy steps say how fast recomputing is.
  const double compute_seconds = seconds - output.swap_out_seconds - output.swap_in_seconds;
  if (prefill_tokens < 32 || prefill_tokens * 2 < scheduled.num_batched_tokens || compute_seconds <= 0) return;
  prefill_rate_.Add(prefill_tokens, compute_seconds);
  if (kv_->has_tiers()) kv_->tiers()->set_prefill_tokens_per_second(prefill_rate_.units_per_second());
}

int64_t Engine::CountStrandedBlocks() const {
  int64_t stranded = 0;
  for (const kv::RequestId id : kv_->request_ids()) {
    if (!scheduler_->HasSequence(id)) stranded += static_cast<int64_t>(kv_->block_table(id).size());
  }
  stranded += handoffs_.StrandedBlocks(NowMs());
  if (kv_->has_tiers()) {
    stranded += kv_->tiers()->num_lookup_pins();
    for (const auto& [owner, held] : kv_->tiers()->load_holds()) {
      if (!scheduler_->HasSequence(owner)) stranded += held;  // a load hold nobody releases
    }
  }
  return stranded;
}

EngineStats Engine::stats() const {
  const SchedulerStats s = scheduler_->stats();
  const kv::PrefixCacheStats& p = kv_->prefix_cache_stats();
  EngineStats e;
  e.num_unfinished_requests = s.num_requests;
  e.num_running_seqs = s.num_running_seqs;
  e.num_waiting_seqs = s.num_waiting_seqs;
  e.num_receiving_seqs = s.num_receiving_seqs;
  e.num_prefilled_seqs = s.num_prefilled_seqs;
  e.num_kv_blocks = kv_->num_blocks();
  e.num_kv_blocks_used = kv_->num_used_blocks();
  e.num_kv_blocks_free = kv_->num_free_blocks();
  e.num_kv_blocks_cached = kv_->num_cached_blocks();
  e.kv_usage = kv_->usage();
  e.prefix_cache_queries = p.queries;
  e.prefix_cache_hits = p.hits;
  e.prefix_cache_query_tokens = p.prefix_cache_queries_tokens;
  e.prefix_cache_hit_tokens = p.prefix_cache_hit_tokens;
  e.num_prefill_tokens = s.num_prefill_tokens;
  e.num_decode_tokens = s.num_decode_tokens;
  e.num_preemptions = s.num_preemptions;
  e.num_deferred_for_prefix = s.num_deferred_for_prefix;
  e.num_steps = num_steps_;
  e.num_runner_failures = num_runner_failures_;
  e.num_swap_in_retries = num_swap_in_retries_;
  e.num_finished_requests = s.num_finished_requests;
  e.num_aborted_requests = s.num_aborted_requests;
  e.num_failed_requests = s.num_failed_requests;
  e.last_batch_num_seqs = s.last_batch_num_seqs;
  e.last_batch_num_tokens = s.last_batch_num_tokens;
  const kv::KvHandoffStats& h = handoffs_.stats();
  e.num_leases_granted = h.leases_granted;
  e.num_leases_committed = h.leases_committed;
  e.num_leases_failed = h.leases_failed;
  e.num_leases_expired = h.leases_expired;
  e.num_leases_aborted = h.leases_aborted;
  e.num_remote_prefill_fallbacks = num_remote_prefill_fallbacks_;
  e.num_prefill_releases_expired = h.pins_expired;
  e.num_kv_blocks_stranded = CountStrandedBlocks();
  e.num_kv_blocks_quarantined = handoffs_.num_quarantined_blocks();
  e.prefix_cache_host_hit_tokens = p.host_hit_tokens;
  e.num_waiting_for_disk = s.num_waiting_for_disk;
  e.num_waiting_for_lookup = s.num_waiting_for_lookup;
  e.num_disk_blocks_lost = s.num_disk_blocks_lost;
  e.num_disk_loads_deferred = s.num_disk_loads_deferred;
  e.prefill_tokens_per_second = prefill_rate_.units_per_second();
  if (const kv::KvTiers* tiers = kv_->tiers(); tiers != nullptr) {
    e.has_host_tier = true;
    e.host_tier = tiers->host().stats();
    e.host_tier_slots = tiers->host().num_slots();
    e.host_tier_resident = tiers->host().num_resident();
    e.tiers = tiers->stats();
    e.tier_call_seconds = kv_->tier_call_seconds();
    if (const kv::DiskKvTier* disk = tiers->disk(); disk != nullptr) {
      e.has_disk_tier = true;
      e.disk_tier = disk->stats();
      e.disk_tier_records = disk->num_records();
    }
    for (int32_t i = 0; i < tiers->num_connectors(); ++i) {
      if (tiers->connector(i).tier() != kv::Tier::kStore) continue;
      e.has_store_tier = true;
      e.store_tier = tiers->connector(i).stats();
    }
  }
  return e;
}

}  // namespace kvmesh::engine
