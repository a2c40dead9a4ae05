#include "engine/engine.h"

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
  SchedulerOptions scheduler_options = options.scheduler;
  scheduler_options.argmax_on_runner = runner.returns_argmax();
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                          Scheduler::Create(scheduler_options, *kv, runner.vocab_size()));
  const RequestLimits limits{.vocab_size = runner.vocab_size(),
                             .max_model_len = options.max_model_len,
                             .max_num_seqs = options.scheduler.max_num_seqs,
                             .num_kv_blocks = kv->num_blocks(),
                             .block_size_tokens = kv->block_size_tokens(),
                             .max_logprobs = options.max_logprobs};
  return std::unique_ptr<Engine>(new Engine(options, runner, std::move(kv), std::move(scheduler), limits));
}

Engine::Engine(const EngineOptions& options, ModelRunner& runner, std::unique_ptr<kv::KvCacheManager> kv,
               std::unique_ptr<Scheduler> scheduler, const RequestLimits& limits)
    : runner_(runner),
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
  KVMESH_ASSIGN_OR_RETURN(SchedulerOutput scheduled, scheduler_->Schedule());
  if (scheduled.empty()) return reclaimed;
  ++num_steps_;
  // NOTE: the per-layer hook is installed only when a streamed prefill runs in this
  // step; ordinary steps leave it empty.
  std::vector<LayerExport> layer_exports;
  if (!streamed_prefills_.empty()) layer_exports = PlanLayerExports(scheduled);
  if (!layer_exports.empty()) {
    scheduled.batch.on_layer_kv_written = [this, &layer_exports](int32_t layer) { ExportLayer(layer_exports, layer); };
  }
  absl::StatusOr<ModelOutput> result = runner_.Execute(scheduled.batch);
  scheduled.batch.on_layer_kv_written = nullptr;
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
  for (const RequestOutput& output : outputs) {
    if (output.prefill_result.has_value()) {
      if (streamed_prefills_.contains(output.request_id)) FinishStreamedPrefill(output.request_id, *output.prefill_result);
      held_prefills_[output.request_id] =
          HeldPrefill{.block_ids = output.prefill_result->block_ids,
                      .deadline_ms = DeadlineAfter(prefill_release_timeout_ms_)};
    }
    if (output.finished) {
      held_prefills_.erase(output.request_id);
      streamed_prefills_.erase(output.request_id);
      if (const auto lease = lease_of_request_.find(output.request_id); lease != lease_of_request_.end()) {
        // Commit, fail and expiry close their lease themselves: what is left was aborted.
        ++num_leases_aborted_;
        leases_.erase(lease->second);
        lease_of_request_.erase(lease);
      }
    }
    const auto it = callbacks_.find(output.request_id);
    if (it == callbacks_.end()) continue;
    it->second(output);
    if (output.finished) callbacks_.erase(it);
  }
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
  e.num_finished_requests = s.num_finished_requests;
  e.num_aborted_requests = s.num_aborted_requests;
  e.num_failed_requests = s.num_failed_requests;
  e.last_batch_num_seqs = s.last_batch_num_seqs;
  e.last_batch_num_tokens = s.last_batch_num_tokens;
  e.num_leases_granted = num_leases_granted_;
  e.num_leases_committed = num_leases_committed_;
  e.num_leases_failed = num_leases_failed_;
  e.num_leases_expired = num_leases_expired_;
  e.num_leases_aborted = num_leases_aborted_;
  e.num_prefill_releases_expired = num_prefill_releases_expired_;
  return e;
}

}  // namespace kvmesh::engine
