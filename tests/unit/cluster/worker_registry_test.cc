#include "cluster/worker_registry.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "kv/block_hash.h"

namespace kvmesh::cluster {
namespace {

WorkerRegistration Worker(const std::string& id, WorkerRole role = WorkerRole::kBoth, const std::string& model = "m") {
  return WorkerRegistration{
      .worker_id = id,
      .address = absl::StrCat("127.0.0.1:", 9000 + id.size()),
      .role = role,
      .model = model,
      .kv_cache_spec = KvCacheSpec{.block_size_tokens = 4, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8}};
}

std::vector<kv::KvEvent> StoredEvents(const std::vector<kv::BlockHash>& hashes) {
  std::vector<kv::KvEvent> events;
  for (const auto& h : hashes) events.push_back({.kind = kv::KvEvent::Kind::kStored, .block_hash = h, .num_tokens = 4});
  return events;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  ManualClock clock_;
  WorkerRegistry registry_{{.heartbeat_interval_ms = 100, .worker_ttl_ms = 1000, .clock = &clock_}};
};

TEST_F(WorkerRegistryTest, RegisterAndList) {
  ASSERT_TRUE(registry_.Register(Worker("b")).ok());
  ASSERT_TRUE(registry_.Register(Worker("a", WorkerRole::kPrefill)).ok());
  ASSERT_TRUE(registry_.Register(Worker("c", WorkerRole::kDecode, "other")).ok());
  const auto all = registry_.List();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].registration.worker_id, "a");
  EXPECT_EQ(all[0].registration.role, WorkerRole::kPrefill);
  EXPECT_EQ(all[0].registered_at, clock_.Now());
  EXPECT_EQ(registry_.List("m").size(), 2u);
  EXPECT_EQ(registry_.List("other").size(), 1u);
  EXPECT_EQ(registry_.heartbeat_interval_ms(), 100);
  EXPECT_EQ(registry_.worker_ttl_ms(), 1000);
}

TEST_F(WorkerRegistryTest, RegisterRejectsBadRegistrations) {
  WorkerRegistration r = Worker("a");
  r.worker_id.clear();
  EXPECT_EQ(registry_.Register(r).code(), absl::StatusCode::kInvalidArgument);
  r = Worker("a");
  r.address.clear();
  EXPECT_EQ(registry_.Register(r).code(), absl::StatusCode::kInvalidArgument);
  r = Worker("a");
  r.kv_cache_spec.block_size_tokens = 0;
  EXPECT_EQ(registry_.Register(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.num_workers(), 0);
}

TEST_F(WorkerRegistryTest, RegisterRejectsAKvSpecThatDiffersWithinAModel) {
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  WorkerRegistration r = Worker("b");
  r.kv_cache_spec.block_size_tokens = 16;
  EXPECT_EQ(registry_.Register(r).code(), absl::StatusCode::kFailedPrecondition);
  r.model = "another-model";
  EXPECT_TRUE(registry_.Register(r).ok());
  // Once the mismatching worker is gone, the new spec is accepted.
  ASSERT_TRUE(registry_.Deregister("a").ok());
  r.model = "m";
  EXPECT_TRUE(registry_.Register(r).ok());
}

TEST_F(WorkerRegistryTest, TensorParallelSizesMayDifferWithinAModel) {
  // Placement pairs only equal sizes for a KV hand-off; each serves alone regardless.
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  WorkerRegistration r = Worker("b");
  r.kv_cache_spec.tp_size = 2;
  EXPECT_TRUE(registry_.Register(r).ok());
  r = Worker("c");
  r.kv_cache_spec.tp_size = 2;
  r.kv_cache_spec.num_layers = 3;  // but not another layout
  EXPECT_EQ(registry_.Register(r).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerRegistryTest, HeartbeatOfUnknownWorkerIsNotFound) {
  EXPECT_EQ(registry_.Heartbeat("ghost", {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Deregister("ghost").code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, HeartbeatRecordsLoad) {
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  HeartbeatReport report;
  report.load = WorkerLoad{.num_running_seqs = 3, .num_waiting_seqs = 2, .kv_blocks_total = 100, .kv_blocks_used = 25};
  clock_.Advance(absl::Milliseconds(50));
  ASSERT_TRUE(registry_.Heartbeat("a", report).ok());
  const auto list = registry_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].load.num_running_seqs, 3);
  EXPECT_DOUBLE_EQ(list[0].load.kv_usage(), 0.25);
  EXPECT_EQ(list[0].last_heartbeat_at, clock_.Now());
}

TEST_F(WorkerRegistryTest, WorkerExpiresAfterTtlWithoutHeartbeats) {
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.Register(Worker("b")).ok());
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(400));
    ASSERT_TRUE(registry_.Heartbeat("b", {}).ok());
    if (i < 2) {
      EXPECT_EQ(registry_.List().size(), 2u) << "step " << i;  // a is within its TTL
    }
  }
  const auto list = registry_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].registration.worker_id, "b");
  EXPECT_EQ(registry_.Heartbeat("a", {}).code(), absl::StatusCode::kNotFound);
  // Registering again brings it back.
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  EXPECT_EQ(registry_.List().size(), 2u);
}

TEST_F(WorkerRegistryTest, ExactlyTtlIsStillAlive) {
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  clock_.Advance(absl::Milliseconds(1000));
  EXPECT_TRUE(registry_.ExpireStale().empty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(registry_.ExpireStale(), std::vector<std::string>{"a"});
  EXPECT_EQ(registry_.num_workers(), 0);
}

TEST_F(WorkerRegistryTest, StatsCountWorkersByRoleIndexedHashesAndExpirations) {
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, 4, 0);
  ASSERT_TRUE(registry_.Register(Worker("p", WorkerRole::kPrefill)).ok());
  ASSERT_TRUE(registry_.Register(Worker("d", WorkerRole::kDecode)).ok());
  ASSERT_TRUE(registry_.Register(Worker("b", WorkerRole::kBoth)).ok());
  ASSERT_TRUE(registry_.Heartbeat("p", {.kv_events = StoredEvents(hashes)}).ok());
  ASSERT_TRUE(registry_.Heartbeat("d", {.kv_events = StoredEvents({hashes[0]}), .draining = true}).ok());
  RegistryStats stats = registry_.stats();
  EXPECT_EQ(stats.num_prefill_workers, 1);
  EXPECT_EQ(stats.num_decode_workers, 1);
  EXPECT_EQ(stats.num_both_workers, 1);
  EXPECT_EQ(stats.num_draining_workers, 1);
  EXPECT_EQ(stats.num_indexed_hashes, 2);  // distinct hashes, whoever holds them
  EXPECT_EQ(stats.num_expired_total, 0);

  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(registry_.Heartbeat("b", {}).ok());
  clock_.Advance(absl::Milliseconds(600));
  EXPECT_EQ(registry_.ExpireStale(), (std::vector<std::string>{"d", "p"}));
  stats = registry_.stats();
  EXPECT_EQ(stats.num_prefill_workers + stats.num_decode_workers, 0);
  EXPECT_EQ(stats.num_both_workers, 1);
  EXPECT_EQ(stats.num_indexed_hashes, 0);
  EXPECT_EQ(stats.num_expired_total, 2);
  // A deregistration is not an expiration.
  ASSERT_TRUE(registry_.Deregister("b").ok());
  EXPECT_EQ(registry_.stats().num_expired_total, 2);
}

TEST_F(WorkerRegistryTest, ExpiryDropsTheWorkersIndexedBlocks) {
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, 4, 0);
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents(hashes)}).ok());
  EXPECT_EQ(registry_.List()[0].num_indexed_blocks, 2);
  clock_.Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  EXPECT_EQ(registry_.List()[0].num_indexed_blocks, 0);
  EXPECT_EQ(registry_.Candidates("m", hashes)[0].prefix.num_blocks, 0);
}

TEST_F(WorkerRegistryTest, CandidatesCarryPrefixMatchesAndSkipDrainingAndExcluded) {
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4, 0);
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.Register(Worker("b")).ok());
  ASSERT_TRUE(registry_.Register(Worker("c")).ok());
  ASSERT_TRUE(registry_.Register(Worker("d", WorkerRole::kBoth, "other")).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents(hashes)}).ok());
  ASSERT_TRUE(registry_.Heartbeat("b", {.kv_events = StoredEvents({hashes[0]})}).ok());
  ASSERT_TRUE(registry_.Heartbeat("c", {.draining = true}).ok());
  auto candidates = registry_.Candidates("m", hashes);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].worker.registration.worker_id, "a");
  EXPECT_EQ(candidates[0].prefix.num_blocks, 3);
  EXPECT_EQ(candidates[1].prefix.num_blocks, 1);
  const std::vector<std::string> exclude = {"a"};
  candidates = registry_.Candidates("m", hashes, exclude);
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].worker.registration.worker_id, "b");
}

TEST_F(WorkerRegistryTest, AWorkerReportedUnreachableGetsNoPlacementsUntilItsTtlOrARegister) {
  WorkerRegistry registry({.heartbeat_interval_ms = 100, .worker_ttl_ms = 60000, .clock = &clock_,
                           .unreachable_ttl_ms = 5000});
  ASSERT_TRUE(registry.Register(Worker("a")).ok());
  ASSERT_TRUE(registry.Register(Worker("bb")).ok());
  EXPECT_EQ(registry.ReportUnreachable("", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.ReportUnreachable("nobody", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.ReportUnreachable("", "10.0.0.1:1").status().code(), absl::StatusCode::kNotFound);
  // By address, as a decode worker knows its prefill worker.
  absl::StatusOr<std::string> id = registry.ReportUnreachable("", Worker("a").address);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "a");
  auto candidates = registry.Candidates("m", {});
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].worker.registration.worker_id, "bb");
  // Its heartbeats go on (the scheduler still hears it): it stays out of placement.
  clock_.Advance(absl::Milliseconds(4000));
  ASSERT_TRUE(registry.Heartbeat("a", {}).ok());
  EXPECT_EQ(registry.Candidates("m", {}).size(), 1u);
  clock_.Advance(absl::Milliseconds(1001));
  EXPECT_EQ(registry.Candidates("m", {}).size(), 2u);
  // A restart (Register) clears a report at once.
  ASSERT_TRUE(registry.ReportUnreachable("bb", "").ok());
  EXPECT_EQ(registry.Candidates("m", {}).size(), 1u);
  ASSERT_TRUE(registry.Register(Worker("bb")).ok());
  EXPECT_EQ(registry.Candidates("m", {}).size(), 2u);
}

TEST_F(WorkerRegistryTest, SnapshotHeartbeatReplacesTheWorkersBlocks) {
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, 4, 0);
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents(hashes)}).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents({hashes[1]}), .kv_events_snapshot = true}).ok());
  EXPECT_EQ(registry_.List()[0].num_indexed_blocks, 1);
  EXPECT_EQ(registry_.Candidates("m", hashes)[0].prefix.num_blocks, 0);
}

TEST_F(WorkerRegistryTest, PlacementsCountUntilTheNextHeartbeat) {
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  registry_.NotePlacement("a");
  registry_.NotePlacement("a");
  registry_.NotePlacement("ghost");  // no-op
  EXPECT_EQ(registry_.List()[0].num_recent_placements, 2);
  ASSERT_TRUE(registry_.Heartbeat("a", {}).ok());
  EXPECT_EQ(registry_.List()[0].num_recent_placements, 0);
}

TEST_F(WorkerRegistryTest, APlacedPromptsUnheldBlocksAreInFlightUntilReported) {
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4, 0);
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.Register(Worker("b")).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents({hashes[0]})}).ok());
  registry_.NotePlacement("a", hashes);
  auto candidates = registry_.Candidates("m", hashes);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].prefix.num_blocks, 3);
  EXPECT_EQ(candidates[0].prefix.num_blocks_in_flight, 2);
  EXPECT_EQ(candidates[0].prefix.num_blocks_by_tier[0], 1);
  EXPECT_EQ(candidates[1].prefix.num_blocks, 0);
  // Reported: cached now, no longer in flight.
  ASSERT_TRUE(registry_.Heartbeat("a", {.kv_events = StoredEvents({hashes[1], hashes[2]})}).ok());
  candidates = registry_.Candidates("m", hashes);
  EXPECT_EQ(candidates[0].prefix.num_blocks, 3);
  EXPECT_EQ(candidates[0].prefix.num_blocks_in_flight, 0);
  // A restart forgets the records with the blocks.
  registry_.NotePlacement("b", hashes);
  ASSERT_TRUE(registry_.Register(Worker("b")).ok());
  EXPECT_EQ(registry_.Candidates("m", hashes)[1].prefix.num_blocks, 0);
}

TEST(WorkerRegistryInFlightTest, AZeroTtlRecordsNothing) {
  ManualClock clock;
  WorkerRegistry registry({.clock = &clock, .in_flight_prefix_ttl_ms = 0});
  const auto hashes = kv::HashFullBlocks(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, 4, 0);
  ASSERT_TRUE(registry.Register(Worker("a")).ok());
  registry.NotePlacement("a", hashes);
  EXPECT_EQ(registry.Candidates("m", hashes)[0].prefix.num_blocks, 0);
  EXPECT_EQ(registry.List()[0].num_recent_placements, 1);
}

TEST_F(WorkerRegistryTest, ModelKvCacheSpecIsUnavailableWithoutWorkers) {
  EXPECT_EQ(registry_.ModelKvCacheSpec("m").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(registry_.Register(Worker("a")).ok());
  ASSERT_TRUE(registry_.ModelKvCacheSpec("m").ok());
  EXPECT_EQ(registry_.ModelKvCacheSpec("m")->block_size_tokens, 4);
}

}  // namespace
}  // namespace kvmesh::cluster
