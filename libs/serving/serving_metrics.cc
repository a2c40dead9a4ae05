#include "serving/serving_metrics.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "metrics/buckets.h"
#include "serving/kv_tier_metrics.h"

namespace kvmesh::serving {

struct ServingMetrics::Impl {
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* itl = nullptr;
  metrics::Histogram* e2e = nullptr;
  metrics::CounterFamily* finished = nullptr;
  metrics::CounterFamily* rejected = nullptr;
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* generation_tokens = nullptr;
  metrics::CounterFamily* success = nullptr;
  metrics::Histogram* queue_time = nullptr;
  metrics::Histogram* prefill_time = nullptr;
  metrics::Histogram* decode_time = nullptr;
  metrics::Histogram* prompt_length = nullptr;
  metrics::Histogram* generation_length = nullptr;
};

namespace {

// Request lengths in tokens: 1, 2, 5, 10, 20, 50, ... 1M, as vLLM's
// vllm:request_prompt_tokens (1-2-5 steps up to the longest context).
std::vector<double> RequestLengthBuckets() {
  std::vector<double> bounds;
  for (double decade = 1; decade <= 1e6; decade *= 10) {
    for (double step : {1.0, 2.0, 5.0}) {
      if (decade * step <= 1e6) bounds.push_back(decade * step);
    }
  }
  return bounds;
}

// Seconds between two milestones, or nullopt when either is unknown (zero).
std::optional<double> Phase(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  if (from == std::chrono::steady_clock::time_point{} || to == std::chrono::steady_clock::time_point{}) {
    return std::nullopt;
  }
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServingMetrics>> ServingMetrics::Create(
    metrics::Registry& registry, std::function<engine::EngineStats()> engine_stats) {
  std::unique_ptr<ServingMetrics> m(new ServingMetrics());
  m->impl_ = std::make_shared<Impl>();
  Impl& i = *m->impl_;
  KVMESH_ASSIGN_OR_RETURN(i.ttft, registry.AddHistogram("kvmesh_time_to_first_token_seconds",
                                                        "Time from request arrival to its first generated token.",
                                                        metrics::TimeToFirstTokenBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.itl, registry.AddHistogram("kvmesh_inter_token_latency_seconds",
                                                       "Time between consecutive generated tokens of a request.",
                                                       metrics::InterTokenLatencyBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.e2e, registry.AddHistogram("kvmesh_e2e_request_latency_seconds",
                                                       "Time from request arrival to its last token.",
                                                       metrics::EndToEndLatencyBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.finished, registry.AddCounterFamily("kvmesh_request_finished_total",
                                                                "Finished samples by finish reason.",
                                                                {"finished_reason"}));
  KVMESH_ASSIGN_OR_RETURN(i.rejected, registry.AddCounterFamily("kvmesh_request_rejected_total",
                                                                "Requests refused before reaching the engine, by HTTP status.",
                                                                {"code"}));
  KVMESH_ASSIGN_OR_RETURN(i.prompt_tokens, registry.AddCounter("kvmesh_prompt_tokens_total", "Prompt tokens processed."));
  KVMESH_ASSIGN_OR_RETURN(i.generation_tokens,
                          registry.AddCounter("kvmesh_generation_tokens_total", "Tokens generated."));
  KVMESH_ASSIGN_OR_RETURN(i.success, registry.AddCounterFamily("kvmesh_request_success_total",
                                                               "Finished samples that did not fail, by finish reason.",
                                                               {"finished_reason"}));
  KVMESH_ASSIGN_OR_RETURN(i.queue_time, registry.AddHistogram("kvmesh_request_queue_time_seconds",
                                                              "Time a request waited from engine arrival to its first step.",
                                                              metrics::EndToEndLatencyBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.prefill_time,
                          registry.AddHistogram("kvmesh_request_prefill_time_seconds",
                                                "Time from a request's first step to its first token.",
                                                metrics::EndToEndLatencyBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.decode_time, registry.AddHistogram("kvmesh_request_decode_time_seconds",
                                                               "Time from a request's first token to its last.",
                                                               metrics::EndToEndLatencyBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.prompt_length, registry.AddHistogram("kvmesh_request_prompt_tokens",
                                                                 "Prompt length of finished requests, in tokens.",
                                                                 RequestLengthBuckets()));
  KVMESH_ASSIGN_OR_RETURN(i.generation_length,
                          registry.AddHistogram("kvmesh_request_generation_tokens",
                                                "Tokens generated by finished requests (all samples).",
                                                RequestLengthBuckets()));
  if (!engine_stats) return m;
  // Engine state, read at scrape time. NOTE: the stats call copies a snapshot under a
  // mutex; one scrape calls it once per gauge, which is cheap at scrape rates.
  struct GaugeSpec {
    const char* name;
    const char* help;
    std::function<double(const engine::EngineStats&)> read;
  };
  const GaugeSpec specs[] = {
      {"kvmesh_num_requests_running", "Sequences in the running batch.",
       [](const engine::EngineStats& s) { return s.num_running_seqs; }},
      {"kvmesh_num_requests_waiting", "Sequences waiting to be scheduled.",
       [](const engine::EngineStats& s) { return s.num_waiting_seqs; }},
      {"kvmesh_kv_cache_usage_ratio", "Fraction of KV blocks in use (1 = full).",
       [](const engine::EngineStats& s) { return s.kv_usage; }},
      {"kvmesh_prefix_cache_queries", "Prompt tokens looked up in the prefix cache (since start).",
       [](const engine::EngineStats& s) { return static_cast<double>(s.prefix_cache_query_tokens); }},
      {"kvmesh_prefix_cache_hits", "Prompt tokens found in the prefix cache (since start).",
       [](const engine::EngineStats& s) { return static_cast<double>(s.prefix_cache_hit_tokens); }},
      {"kvmesh_num_preemptions", "Sequences preempted for lack of KV blocks (since start).",
       [](const engine::EngineStats& s) { return static_cast<double>(s.num_preemptions); }},
      {"kvmesh_prefill_tokens", "Prompt tokens computed, cache hits excluded (since start).",
       [](const engine::EngineStats& s) { return static_cast<double>(s.num_prefill_tokens); }},
      {"kvmesh_batch_size_tokens", "Tokens in the latest engine step.",
       [](const engine::EngineStats& s) { return s.last_batch_num_tokens; }},
  };
  for (const GaugeSpec& spec : specs) {
    KVMESH_RETURN_IF_ERROR(
        registry.AddCallbackGauge(spec.name, spec.help, [engine_stats, read = spec.read] { return read(engine_stats()); })
            .status());
  }
  KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGaugeFamily * blocks,
                          registry.AddCallbackGaugeFamily("kvmesh_kv_blocks", "KV cache blocks by state.", {"state"}));
  const std::pair<const char*, std::function<double(const engine::EngineStats&)>> states[] = {
      {"used", [](const engine::EngineStats& s) { return s.num_kv_blocks_used; }},
      {"free", [](const engine::EngineStats& s) { return s.num_kv_blocks_free; }},
      {"cached", [](const engine::EngineStats& s) { return s.num_kv_blocks_cached; }},
  };
  for (const auto& [state, read] : states) {
    KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGauge * g, blocks->WithLabels({std::string_view(state)}));
    g->SetCallback([engine_stats, read] { return read(engine_stats()); });
  }
  KVMESH_RETURN_IF_ERROR(AddKvTierMetrics(registry, engine_stats));
  return m;
}

void ServingMetrics::ObserveTimeToFirstToken(double seconds) { impl_->ttft->Observe(seconds); }
void ServingMetrics::ObserveInterTokenLatency(double seconds) { impl_->itl->Observe(seconds); }
void ServingMetrics::ObserveEndToEnd(double seconds) { impl_->e2e->Observe(seconds); }

void ServingMetrics::CountFinished(std::string_view finish_reason) {
  if (auto c = impl_->finished->WithLabels({finish_reason}); c.ok()) (*c)->Increment();
  if (finish_reason == "error") return;  // vLLM's request_success counts stop, length and abort.
  if (auto c = impl_->success->WithLabels({finish_reason}); c.ok()) (*c)->Increment();
}

void ServingMetrics::ObserveFinishedRequest(const engine::RequestTimes& times, int64_t prompt_tokens,
                                            int64_t generation_tokens) {
  Impl& i = *impl_;
  if (std::optional<double> s = Phase(times.arrival, times.first_scheduled)) i.queue_time->Observe(*s);
  if (std::optional<double> s = Phase(times.first_scheduled, times.first_token)) i.prefill_time->Observe(*s);
  if (std::optional<double> s = Phase(times.first_token, times.finished)) i.decode_time->Observe(*s);
  i.prompt_length->Observe(static_cast<double>(prompt_tokens));
  i.generation_length->Observe(static_cast<double>(generation_tokens));
}

void ServingMetrics::CountRejected(int32_t http_status) {
  const std::string code = std::to_string(http_status);
  if (auto c = impl_->rejected->WithLabels({std::string_view(code)}); c.ok()) (*c)->Increment();
}

void ServingMetrics::AddPromptTokens(int64_t n) { impl_->prompt_tokens->Increment(n); }
void ServingMetrics::AddGenerationTokens(int64_t n) { impl_->generation_tokens->Increment(n); }

}  // namespace kvmesh::serving
