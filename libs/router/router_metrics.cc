#include "router/router_metrics.h"

#include <string>
#include <utility>

#include "core/status_macros.h"

namespace kvmesh::router {

absl::StatusOr<std::unique_ptr<RouterMetrics>> RouterMetrics::Create(metrics::Registry& registry,
                                                                    std::function<double()> inflight) {
  std::unique_ptr<RouterMetrics> m(new RouterMetrics());
  KVMESH_ASSIGN_OR_RETURN(
      m->retries_,
      registry.AddCounter("kvmesh_router_retries_total",
                          "Requests placed again on another decode worker (theirs was unreachable before any token)."));
  KVMESH_ASSIGN_OR_RETURN(m->upstream_errors_,
                          registry.AddCounterFamily("kvmesh_router_upstream_errors_total",
                                                    "Failed upstream calls by stage (place, generate) and gRPC code.",
                                                    {"stage", "code"}));
  KVMESH_RETURN_IF_ERROR(registry
                             .AddCallbackGauge("kvmesh_router_requests_inflight",
                                               "Requests the router has placed or is streaming.", std::move(inflight))
                             .status());
  return m;
}

void RouterMetrics::CountUpstreamError(std::string_view stage, absl::StatusCode code) {
  const std::string code_name = absl::StatusCodeToString(code);
  if (auto c = upstream_errors_->WithLabels({stage, std::string_view(code_name)}); c.ok()) (*c)->Increment();
}

}  // namespace kvmesh::router
