// RouterMetrics: what the router adds on /metrics to the serving metrics (TTFT, ITL,
// e2e, tokens; serving::ServingMetrics) — how its upstream calls fare:
//
//   kvmesh_router_retries_total                      counter: requests placed again on
//       another decode worker because theirs was unreachable before any token
//   kvmesh_router_upstream_errors_total{stage,code}  counter: failed upstream calls,
//       stage "place" (Scheduler.Place) or "generate" (Worker.Generate), code the gRPC
//       status name ("UNAVAILABLE"); client cancellations are not errors
//   kvmesh_router_requests_inflight                  gauge: requests placed or streaming
//
// Thread-safety: thread-safe; the count methods are lock-free but for the first use
// of a (stage, code) pair.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace kvmesh::router {

class RouterMetrics {
 public:
  // Registers the families in `registry` (which must outlive this). `inflight` is
  // read at scrape time, from the scraping thread.
  static absl::StatusOr<std::unique_ptr<RouterMetrics>> Create(metrics::Registry& registry,
                                                              std::function<double()> inflight);

  void CountRetry() { retries_->Increment(); }
  // `stage`: "place" or "generate".
  void CountUpstreamError(std::string_view stage, absl::StatusCode code);

 private:
  RouterMetrics() = default;

  metrics::Counter* retries_ = nullptr;
  metrics::CounterFamily* upstream_errors_ = nullptr;
};

}  // namespace kvmesh::router
