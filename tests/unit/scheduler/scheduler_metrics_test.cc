#include "scheduler_metrics.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "cluster/worker_registry.h"
#include "core/clock.h"
#include "metrics/registry.h"

namespace kvmesh::scheduler {
namespace {

cluster::WorkerRegistration Worker(const std::string& id, cluster::WorkerRole role) {
  return cluster::WorkerRegistration{
      .worker_id = id,
      .address = "127.0.0.1:1",
      .role = role,
      .model = "m",
      .kv_cache_spec = cluster::KvCacheSpec{.block_size_tokens = 4, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8}};
}

class SchedulerMetricsTest : public ::testing::Test {
 protected:
  bool Has(const std::string& line) { return absl::StrContains(registry_.Exposition(), line + "\n"); }

  ManualClock clock_;
  cluster::WorkerRegistry workers_{{.heartbeat_interval_ms = 100, .worker_ttl_ms = 1000, .clock = &clock_}};
  metrics::Registry registry_;
  std::unique_ptr<SchedulerMetrics> metrics_ = SchedulerMetrics::Create(registry_, workers_).value();
};

TEST_F(SchedulerMetricsTest, WorkerGaugesFollowTheRegistryAtScrapeTime) {
  EXPECT_TRUE(Has("kvmesh_scheduler_workers{role=\"decode\"} 0"));
  ASSERT_TRUE(workers_.Register(Worker("d1", cluster::WorkerRole::kDecode)).ok());
  ASSERT_TRUE(workers_.Register(Worker("d2", cluster::WorkerRole::kDecode)).ok());
  ASSERT_TRUE(workers_.Register(Worker("p", cluster::WorkerRole::kPrefill)).ok());
  EXPECT_TRUE(Has("kvmesh_scheduler_workers{role=\"decode\"} 2"));
  EXPECT_TRUE(Has("kvmesh_scheduler_workers{role=\"prefill\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_workers{role=\"both\"} 0"));
  EXPECT_TRUE(Has("kvmesh_scheduler_worker_expirations 0"));
  clock_.Advance(absl::Milliseconds(1001));
  workers_.ExpireStale();
  EXPECT_TRUE(Has("kvmesh_scheduler_workers{role=\"decode\"} 0"));
  EXPECT_TRUE(Has("kvmesh_scheduler_worker_expirations 3"));
  EXPECT_TRUE(Has("kvmesh_scheduler_prefix_index_blocks 0"));
}

TEST_F(SchedulerMetricsTest, CallsAreCountedByCodeAndPlacementsByMode) {
  metrics_->CountHeartbeat(absl::StatusCode::kOk);
  metrics_->CountHeartbeat(absl::StatusCode::kOk);
  metrics_->CountHeartbeat(absl::StatusCode::kNotFound);
  metrics_->CountRegistration(absl::StatusCode::kFailedPrecondition);
  metrics_->ObservePlace(absl::StatusCode::kOk, /*prefill_locally=*/true, 0.0001);
  metrics_->ObservePlace(absl::StatusCode::kOk, /*prefill_locally=*/false, 0.0002);
  metrics_->ObservePlace(absl::StatusCode::kUnavailable, /*prefill_locally=*/false, 0.00005);
  EXPECT_TRUE(Has("kvmesh_scheduler_heartbeats_total{code=\"OK\"} 2"));
  EXPECT_TRUE(Has("kvmesh_scheduler_heartbeats_total{code=\"NOT_FOUND\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_registrations_total{code=\"FAILED_PRECONDITION\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_place_requests_total{code=\"OK\"} 2"));
  EXPECT_TRUE(Has("kvmesh_scheduler_place_requests_total{code=\"UNAVAILABLE\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_placements_total{mode=\"local\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_placements_total{mode=\"disaggregated\"} 1"));
  EXPECT_TRUE(Has("kvmesh_scheduler_place_latency_seconds_count 3"));
}

TEST_F(SchedulerMetricsTest, CreatingTwiceInOneRegistryFails) {
  EXPECT_EQ(SchedulerMetrics::Create(registry_, workers_).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::scheduler
