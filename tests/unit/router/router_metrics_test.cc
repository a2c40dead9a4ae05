#include "router/router_metrics.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "metrics/registry.h"

namespace kvmesh::router {
namespace {

TEST(RouterMetricsTest, CountsRetriesAndUpstreamErrorsByStageAndCode) {
  metrics::Registry registry;
  double inflight = 2;
  auto m = RouterMetrics::Create(registry, [&inflight] { return inflight; }).value();
  m->CountRetry();
  m->CountUpstreamError("generate", absl::StatusCode::kUnavailable);
  m->CountUpstreamError("generate", absl::StatusCode::kUnavailable);
  m->CountUpstreamError("place", absl::StatusCode::kDeadlineExceeded);
  const std::string text = registry.Exposition();
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_router_retries_total 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_router_upstream_errors_total{stage=\"generate\",code=\"UNAVAILABLE\"} 2\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_router_upstream_errors_total{stage=\"place\",code=\"DEADLINE_EXCEEDED\"} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_router_requests_inflight 2\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "# TYPE kvmesh_router_retries_total counter\n")) << text;
}

}  // namespace
}  // namespace kvmesh::router
