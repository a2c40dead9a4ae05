#include "serving/serving_metrics.h"

#include <chrono>
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

TEST(ServingMetricsTest, FinishedRequestFillsThePhaseAndLengthHistograms) {
  metrics::Registry registry;
  auto m = ServingMetrics::Create(registry, nullptr).value();
  const auto t0 = std::chrono::steady_clock::now();
  engine::RequestTimes times;
  times.arrival = t0;
  times.first_scheduled = t0 + std::chrono::milliseconds(250);
  times.first_token = t0 + std::chrono::milliseconds(750);
  times.finished = t0 + std::chrono::milliseconds(2750);
  m->ObserveFinishedRequest(times, /*prompt_tokens=*/30, /*generation_tokens=*/7);
  const std::string text = registry.Exposition();
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_queue_time_seconds_sum 0.25\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prefill_time_seconds_sum 0.5\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_decode_time_seconds_sum 2\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_decode_time_seconds_bucket{le=\"1.5\"} 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_decode_time_seconds_bucket{le=\"2\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prompt_tokens_sum 30\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prompt_tokens_bucket{le=\"20\"} 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prompt_tokens_bucket{le=\"50\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_generation_tokens_sum 7\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_generation_tokens_count 1\n")) << text;
}

TEST(ServingMetricsTest, UnknownMilestonesLeaveTheirPhasesOut) {
  metrics::Registry registry;
  auto m = ServingMetrics::Create(registry, nullptr).value();
  engine::RequestTimes times;  // an output from another process: no engine milestones
  times.first_token = std::chrono::steady_clock::now();
  times.finished = times.first_token + std::chrono::seconds(1);
  m->ObserveFinishedRequest(times, 4, 2);
  const std::string text = registry.Exposition();
  // Histograms without labels always expose their one child: unobserved, it counts 0.
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_queue_time_seconds_count 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prefill_time_seconds_count 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_decode_time_seconds_count 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_prompt_tokens_count 1\n")) << text;
}

TEST(ServingMetricsTest, SuccessCountsEveryReasonButError) {
  metrics::Registry registry;
  auto m = ServingMetrics::Create(registry, nullptr).value();
  for (const char* reason : {"stop", "stop", "length", "abort", "error"}) m->CountFinished(reason);
  const std::string text = registry.Exposition();
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_success_total{finished_reason=\"stop\"} 2\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_success_total{finished_reason=\"length\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_success_total{finished_reason=\"abort\"} 1\n")) << text;
  EXPECT_FALSE(absl::StrContains(text, "kvmesh_request_success_total{finished_reason=\"error\"}")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvmesh_request_finished_total{finished_reason=\"error\"} 1\n")) << text;
}

}  // namespace
}  // namespace kvmesh::serving
