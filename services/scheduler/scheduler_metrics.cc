#include "scheduler_metrics.h"

#include <functional>
#include <string>
#include <utility>

#include "core/status_macros.h"
#include "metrics/buckets.h"

namespace kvmesh::scheduler {

absl::StatusOr<std::unique_ptr<SchedulerMetrics>> SchedulerMetrics::Create(metrics::Registry& registry,
                                                                         const cluster::WorkerRegistry& workers) {
  std::unique_ptr<SchedulerMetrics> m(new SchedulerMetrics());
  const cluster::WorkerRegistry* w = &workers;
  // Registry state, read at scrape time (one stats() copy per gauge: cheap at scrape rates).
  KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGaugeFamily * by_role,
                          registry.AddCallbackGaugeFamily("kvmesh_scheduler_workers",
                                                          "Live workers by role (draining ones included).", {"role"}));
  const std::pair<const char*, int32_t cluster::RegistryStats::*> roles[] = {
      {"prefill", &cluster::RegistryStats::num_prefill_workers},
      {"decode", &cluster::RegistryStats::num_decode_workers},
      {"both", &cluster::RegistryStats::num_both_workers},
  };
  for (const auto& [role, field] : roles) {
    KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGauge * g, by_role->WithLabels({std::string_view(role)}));
    g->SetCallback([w, field] { return static_cast<double>(w->stats().*field); });
  }
  struct GaugeSpec {
    const char* name;
    const char* help;
    std::function<double(const cluster::RegistryStats&)> read;
  };
  const GaugeSpec gauges[] = {
      {"kvmesh_scheduler_draining_workers", "Live workers finishing their requests before shutdown.",
       [](const cluster::RegistryStats& s) { return static_cast<double>(s.num_draining_workers); }},
      {"kvmesh_scheduler_prefix_index_blocks", "Distinct KV block hashes in the global prefix index.",
       [](const cluster::RegistryStats& s) { return static_cast<double>(s.num_indexed_hashes); }},
      {"kvmesh_scheduler_kv_store_blocks",
       "Distinct blocks the cluster kv-stores hold, as mirrored from their events (placement counts them).",
       [](const cluster::RegistryStats& s) { return static_cast<double>(s.num_store_keys); }},
      {"kvmesh_scheduler_worker_expirations", "Workers dropped for missing heartbeats (since start).",
       [](const cluster::RegistryStats& s) { return static_cast<double>(s.num_expired_total); }},
  };
  for (const GaugeSpec& spec : gauges) {
    KVMESH_RETURN_IF_ERROR(
        registry.AddCallbackGauge(spec.name, spec.help, [w, read = spec.read] { return read(w->stats()); }).status());
  }

  KVMESH_ASSIGN_OR_RETURN(m->registrations_,
                          registry.AddCounterFamily("kvmesh_scheduler_registrations_total",
                                                    "Register calls by gRPC status code.", {"code"}));
  KVMESH_ASSIGN_OR_RETURN(m->heartbeats_, registry.AddCounterFamily("kvmesh_scheduler_heartbeats_total",
                                                                    "Heartbeat calls by gRPC status code.", {"code"}));
  KVMESH_ASSIGN_OR_RETURN(m->place_requests_,
                          registry.AddCounterFamily("kvmesh_scheduler_place_requests_total",
                                                    "Place calls by gRPC status code.", {"code"}));
  KVMESH_ASSIGN_OR_RETURN(metrics::CounterFamily * placements,
                          registry.AddCounterFamily("kvmesh_scheduler_placements_total",
                                                    "Successful placements by mode (local or disaggregated prefill).",
                                                    {"mode"}));
  KVMESH_ASSIGN_OR_RETURN(m->local_placements_, placements->WithLabels({"local"}));
  KVMESH_ASSIGN_OR_RETURN(m->disaggregated_placements_, placements->WithLabels({"disaggregated"}));
  // 10 us .. ~0.3 s: a placement is a map lookup per prompt block plus a score per worker.
  KVMESH_ASSIGN_OR_RETURN(std::vector<double> buckets, metrics::ExponentialBuckets(1e-5, 2.0, 15));
  KVMESH_ASSIGN_OR_RETURN(m->place_latency_,
                          registry.AddHistogram("kvmesh_scheduler_place_latency_seconds",
                                                "Time to decide one Place call.", std::move(buckets)));
  return m;
}

void SchedulerMetrics::ObservePlace(absl::StatusCode code, bool prefill_locally, double seconds) {
  Count(place_requests_, code);
  if (code == absl::StatusCode::kOk) (prefill_locally ? local_placements_ : disaggregated_placements_)->Increment();
  place_latency_->Observe(seconds);
}

void SchedulerMetrics::Count(metrics::CounterFamily* family, absl::StatusCode code) {
  const std::string name = absl::StatusCodeToString(code);
  if (auto c = family->WithLabels({std::string_view(name)}); c.ok()) (*c)->Increment();
}

}  // namespace kvmesh::scheduler
