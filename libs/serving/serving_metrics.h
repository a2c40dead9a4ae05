// ServingMetrics: the Prometheus metrics of a serving process (what vLLM and
// Dynamo users chart): request latency histograms, token counters, and gauges
// read from the engine at scrape time.
//
//   kvmesh_time_to_first_token_seconds        histogram
//   kvmesh_inter_token_latency_seconds        histogram
//   kvmesh_e2e_request_latency_seconds        histogram
//   kvmesh_request_finished_total{finished_reason}   counter (stop/length/abort/error), per sample
//   kvmesh_request_rejected_total{code}       counter (HTTP status of refused requests)
//   kvmesh_prompt_tokens_total / kvmesh_generation_tokens_total   counters
//   kvmesh_request_success_total{finished_reason}   counter (stop/length/abort), per sample, as vLLM's
//   kvmesh_request_queue_time_seconds / _prefill_time_seconds / _decode_time_seconds   histograms,
//     per engine request, from the engine's RequestTimes (left out when they are unknown)
//   kvmesh_request_prompt_tokens / kvmesh_request_generation_tokens   histograms, per engine request
//   kvmesh_num_requests_running / _waiting, kvmesh_kv_blocks{state=used|free|cached},
//   kvmesh_kv_cache_usage_ratio, kvmesh_prefix_cache_queries / _hits (tokens),
//   kvmesh_num_preemptions, kvmesh_prefill_tokens, kvmesh_batch_size_tokens   (from EngineStats;
//   engine totals are exposed as gauges read at scrape time)
//
// Thread-safety: thread-safe; the observe methods are lock-free.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "metrics/registry.h"

namespace kvmesh::serving {

class ServingMetrics {
 public:
  // Registers every family in `registry` (which must outlive this). `engine_stats`
  // is called at scrape time (from the HTTP thread) for the engine gauges; without it
  // (a process with no engine: the router) they are left out.
  static absl::StatusOr<std::unique_ptr<ServingMetrics>> Create(metrics::Registry& registry,
                                                               std::function<engine::EngineStats()> engine_stats);

  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveEndToEnd(double seconds);
  // One finished sample: "stop", "length", "abort" or "error".
  void CountFinished(std::string_view finish_reason);
  // A request refused before it reached the engine, by HTTP status.
  void CountRejected(int32_t http_status);
  void AddPromptTokens(int64_t n);
  void AddGenerationTokens(int64_t n);
  // One engine request ended (its final output): its prompt length, the tokens its
  // samples generated, and the queue (arrival -> first scheduled), prefill (-> first
  // token) and decode (-> finished) times from `times`. A phase whose two ends are not
  // both known (an output from another process) is not observed.
  void ObserveFinishedRequest(const engine::RequestTimes& times, int64_t prompt_tokens, int64_t generation_tokens);

 private:
  ServingMetrics() = default;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvmesh::serving
