#include "serving/serving_metrics.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "metrics/registry.h"

namespace kvmesh::serving {
namespace {

TEST(ServingMetricsTest, EngineGaugesAreReadAtScrapeTime) {
  metrics::Registry registry;
  engine::EngineStats stats;
  auto m = ServingMetrics::Create(registry, [&stats] { return stats; }).value();
  stats.num_running_seqs = 3;
  stats.num_kv_blocks_used = 7;
  m->ObserveTimeToFirstToken(0.01);
  const std::string text = registry.Exposition();
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_num_requests_running 3\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_kv_blocks{state=\"used\"} 7\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_time_to_first_token_seconds_count 1\n")) << text;
}

TEST(ServingMetricsTest, WithoutAnEngineOnlyTheRequestMetricsAreExported) {
  metrics::Registry registry;
  auto m = ServingMetrics::Create(registry, nullptr).value();
  m->ObserveEndToEnd(0.5);
  m->CountFinished("stop");
  const std::string text = registry.Exposition();
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_e2e_request_latency_seconds_count 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_finished_total{finished_reason=\"stop\"} 1\n")) << text;
  EXPECT_FALSE(absl::StrContains(text, "kvmesh_kv_blocks")) << text;
  EXPECT_FALSE(absl::StrContains(text, "kvmesh_num_requests_running")) << text;
}

}  // namespace
}  // namespace kvmesh::serving
