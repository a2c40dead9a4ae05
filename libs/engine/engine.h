// Engine: one worker's continuous-batching loop (ARCHITECTURE.md §4): schedule → execute
// → sample → emit. It owns the KV cache manager and the Scheduler and borrows a
// ModelRunner. A service drives it from one thread: AddRequest / Abort as requests come
// and go, Step() in a loop while HasUnfinishedRequests().
//
// Guarantees:
//   - AddRequest validates everything before queuing (ValidateEngineRequest); a rejected
//     request allocates nothing.
//   - Every accepted request gets exactly one final output (finished == true): by stop,
//     length, Abort ("abort") or failure ("error"), delivered through Step/Abort's return
//     value and, if set, its on_output callback.
//   - A runner failure fails the requests of that batch (kError outputs carrying the
//     runner's status) and frees their blocks; the engine stays consistent and the other
//     requests continue.
//   - A request's tokens do not depend on batching, chunking, prefix hits or preemption
//     (given a batch-invariant runner): preemption recomputes and keeps the sampler.
//
// Thread-safety: not thread-safe; owned by the engine loop. Other threads post into a
// queue that the loop drains between steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/request_validator.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"

namespace kvmesh::engine {

struct EngineOptions {
  SchedulerOptions scheduler;
  // num_blocks == 0: the runner's num_blocks(). block_size_tokens must equal the runner's.
  // With record_events on, the owner drains DrainKvEvents() every step.
  kv::KvCacheManagerOptions kv;
  // Prompt + generated tokens per sample; required (the model's context length, or less).
  int32_t max_model_len = 0;
  int32_t max_logprobs = kDefaultMaxLogprobs;
};

// Point-in-time counters for metrics. Totals are since Create.
struct EngineStats {
  int32_t num_unfinished_requests = 0;
  int32_t num_running_seqs = 0;
  int32_t num_waiting_seqs = 0;
  // KV pool: used + free + cached == num_kv_blocks.
  int32_t num_kv_blocks = 0;
  int32_t num_kv_blocks_used = 0;
  int32_t num_kv_blocks_free = 0;
  int32_t num_kv_blocks_cached = 0;
  double kv_usage = 0;  // used / total
  // Prefix cache (lookups happen at each admission attempt, retries included).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_query_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Work done: prefill tokens actually computed (cache hits excluded, recomputation after
  // preemption included) and decode tokens.
  int64_t num_prefill_tokens = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_deferred_for_prefix = 0;  // admissions put off a step to share an in-flight prefix
  int64_t num_steps = 0;            // steps that ran a batch
  int64_t num_runner_failures = 0;  // steps whose Execute failed
  int64_t num_finished_requests = 0;
  int64_t num_aborted_requests = 0;
  int64_t num_failed_requests = 0;
  int32_t last_batch_num_seqs = 0;
  int32_t last_batch_num_tokens = 0;
};

class Engine {
 public:
  // `runner` must outlive the engine. InvalidArgument for invalid options: max_model_len
  // < 1, scheduler options, a KV block size other than the runner's, more KV blocks than
  // the runner has, or chunked prefill off with max_num_batched_tokens < max_model_len
  // (a long prompt could never be scheduled).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options, ModelRunner& runner);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. InvalidArgument (see ValidateEngineRequest: empty prompt, token
  // outside the vocabulary, too long for max_model_len, bad sampling params, n too large,
  // more KV than the whole pool); AlreadyExists if an unfinished request has this id.
  // On error nothing is queued or allocated.
  absl::Status AddRequest(EngineRequest request);

  // Ends a request in any state and frees its blocks at once; returns (and streams) its
  // final output, every unfinished sample with finish_reason "abort".
  // FailedPrecondition for an unknown or already finished request id.
  absl::StatusOr<RequestOutput> Abort(const std::string& request_id);

  // One iteration: schedule, run the batch, sample, update, and return (and stream) the
  // outputs of the requests that changed. Empty when nothing could run. A runner error
  // is not an error of Step: its requests end with kError outputs. Internal only for a
  // broken invariant, after which the engine must be discarded.
  absl::StatusOr<std::vector<RequestOutput>> Step();

  bool HasUnfinishedRequests() const { return scheduler_->HasUnfinishedRequests(); }
  EngineStats stats() const;
  // KV events since the last call (empty when options.kv.record_events is off).
  std::vector<kv::KvEvent> DrainKvEvents() { return kv_->DrainEvents(); }

  const RequestLimits& limits() const { return limits_; }
  const kv::KvCacheManager& kv_cache() const { return *kv_; }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  Engine(ModelRunner& runner, std::unique_ptr<kv::KvCacheManager> kv, std::unique_ptr<Scheduler> scheduler,
         const RequestLimits& limits);

  // Invokes the callbacks of `outputs`; forgets those of finished requests.
  void Deliver(const std::vector<RequestOutput>& outputs);

  ModelRunner& runner_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;  // borrows *kv_: declared after it
  const RequestLimits limits_;
  absl::flat_hash_map<std::string, std::function<void(const RequestOutput&)>> callbacks_;
  int64_t num_steps_ = 0;
  int64_t num_runner_failures_ = 0;
};

}  // namespace kvmesh::engine
