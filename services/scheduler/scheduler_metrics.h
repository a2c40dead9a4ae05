// SchedulerMetrics: the scheduler's /metrics (Prometheus text):
//
//   kvmesh_scheduler_workers{role}                   gauge: live workers by role
//       (prefill, decode, both; draining ones included)
//   kvmesh_scheduler_draining_workers                gauge
//   kvmesh_scheduler_prefix_index_blocks             gauge: distinct block hashes in
//       the global prefix index
//   kvmesh_scheduler_worker_expirations              gauge: workers dropped for missing
//       heartbeats since start (the registry's count, read at scrape time, as the
//       engine's totals are)
//   kvmesh_scheduler_registrations_total{code}       counter: Register calls by gRPC code
//   kvmesh_scheduler_heartbeats_total{code}          counter: Heartbeat calls by gRPC code
//       (NOT_FOUND: an expired or unknown worker, told to register again)
//   kvmesh_scheduler_place_requests_total{code}      counter: Place calls by gRPC code
//   kvmesh_scheduler_placements_total{mode}          counter: successful placements,
//       mode "local" (decode worker prefills) or "disaggregated"
//   kvmesh_scheduler_place_latency_seconds           histogram: time to decide one Place
//
// Thread-safety: thread-safe; the count methods are lock-free after the first use of
// a label value.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/worker_registry.h"
#include "metrics/registry.h"

namespace kvmesh::scheduler {

class SchedulerMetrics {
 public:
  // Registers the families in `registry`; both `registry` and `workers` (read at scrape
  // time) must outlive this.
  static absl::StatusOr<std::unique_ptr<SchedulerMetrics>> Create(metrics::Registry& registry,
                                                                 const cluster::WorkerRegistry& workers);

  void CountRegistration(absl::StatusCode code) { Count(registrations_, code); }
  void CountHeartbeat(absl::StatusCode code) { Count(heartbeats_, code); }
  // One Place call: its outcome, whether it prefills locally (when OK) and its latency.
  void ObservePlace(absl::StatusCode code, bool prefill_locally, double seconds);

 private:
  SchedulerMetrics() = default;
  static void Count(metrics::CounterFamily* family, absl::StatusCode code);

  metrics::CounterFamily* registrations_ = nullptr;
  metrics::CounterFamily* heartbeats_ = nullptr;
  metrics::CounterFamily* place_requests_ = nullptr;
  metrics::Counter* local_placements_ = nullptr;
  metrics::Counter* disaggregated_placements_ = nullptr;
  metrics::Histogram* place_latency_ = nullptr;
};

}  // namespace kvmesh::scheduler
