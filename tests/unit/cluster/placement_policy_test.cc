#include "cluster/placement_policy.h"

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "kv/block_hash.h"
#include "kv_store/store_key.h"

namespace kvmesh::cluster {
namespace {

constexpr int32_t kBlock = 16;

std::vector<int32_t> Prompt(int32_t num_tokens, int32_t first = 1) {
  std::vector<int32_t> tokens(num_tokens);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

class PlacementPolicyTest : public ::testing::Test {
 protected:
  // The tests below check scores from reported blocks alone, placing the same prompt
  // several times: in-flight records (InFlightPlacementTest) are off here.
  explicit PlacementPolicyTest(int64_t in_flight_prefix_ttl_ms = 0)
      : registry_({.heartbeat_interval_ms = 100,
                   .worker_ttl_ms = 1000,
                   .clock = &clock_,
                   .in_flight_prefix_ttl_ms = in_flight_prefix_ttl_ms}) {}

  void AddWorker(const std::string& id, WorkerRole role, int32_t max_num_seqs = 64, KvTransportSet transports = {},
                 int32_t tp_size = 1) {
    // NOTE: built in one initializer: assigning short literals to std::string members trips
    // GCC 12's -Wrestrict false positive at -O3.
    const WorkerRegistration r{
        .worker_id = id,
        .address = absl::StrCat(id, ":1"),
        .role = role,
        .model = "m",
        .kv_cache_spec = KvCacheSpec{.block_size_tokens = kBlock, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8,
                                     .tp_size = tp_size},
        .capacity = WorkerCapacity{.max_num_seqs = max_num_seqs},
        .kv_transports = transports};
    ASSERT_TRUE(registry_.Register(r).ok());
  }
  // The worker reports `load` and holds the first `num_blocks` blocks of `tokens`
  // (hashed as a request with `cache_salt` has them).
  void Report(const std::string& id, const std::vector<int32_t>& tokens, int num_blocks, WorkerLoad load = {},
              kv::Tier tier = kv::Tier::kDevice, std::string_view cache_salt = {}) {
    HeartbeatReport report;
    report.load = load;
    const auto hashes = kv::HashFullBlocks(tokens, kBlock, 0, cache_salt);
    for (int i = 0; i < num_blocks; ++i) {
      report.kv_events.push_back(
          {.kind = kv::KvEvent::Kind::kStored, .block_hash = hashes[i], .tier = tier, .num_tokens = kBlock});
    }
    ASSERT_TRUE(registry_.Heartbeat(id, report).ok());
  }
  PlacementRequest Request(const std::vector<int32_t>& tokens) {
    return PlacementRequest{.request_id = "r", .model = "m", .prompt_token_ids = tokens};
  }

  ManualClock clock_;
  WorkerRegistry registry_;
};

TEST_F(PlacementPolicyTest, NoWorkersIsUnavailable) {
  PlacementPolicy policy;
  EXPECT_EQ(policy.Place(Request(Prompt(64)), registry_).status().code(), absl::StatusCode::kUnavailable);
  AddWorker("p", WorkerRole::kBoth);
  PlacementRequest other = Request(Prompt(64));
  other.model = "unknown-model";
  EXPECT_EQ(policy.Place(other, registry_).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(PlacementPolicyTest, OnlyPrefillWorkersIsUnavailable) {
  AddWorker("p", WorkerRole::kPrefill);
  PlacementPolicy policy;
  EXPECT_EQ(policy.Place(Request(Prompt(64)), registry_).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(PlacementPolicyTest, AllWorkersDrainingOrExcludedIsUnavailable) {
  AddWorker("a", WorkerRole::kBoth);
  AddWorker("b", WorkerRole::kBoth);
  ASSERT_TRUE(registry_.Heartbeat("a", {.draining = true}).ok());
  PlacementRequest request = Request(Prompt(64));
  request.exclude_worker_ids = {"b"};
  EXPECT_EQ(PlacementPolicy().Place(request, registry_).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(PlacementPolicyTest, BadRequestsAreInvalidArgument) {
  AddWorker("a", WorkerRole::kBoth);
  PlacementPolicy policy;
  PlacementRequest request{.model = "m"};
  EXPECT_EQ(policy.Place(request, registry_).status().code(), absl::StatusCode::kInvalidArgument);  // no prompt
  request = Request(Prompt(32));
  request.model.clear();
  EXPECT_EQ(policy.Place(request, registry_).status().code(), absl::StatusCode::kInvalidArgument);
  request = Request(Prompt(32));
  request.prompt_block_hashes = kv::HashFullBlocks(Prompt(32), kBlock, 0);
  EXPECT_EQ(policy.Place(request, registry_).status().code(), absl::StatusCode::kInvalidArgument);  // both
  request.prompt_token_ids.clear();
  request.prompt_length_tokens = 20;  // 2 full blocks need >= 32 tokens
  EXPECT_EQ(policy.Place(request, registry_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PlacementPolicyTest, PrefersTheWorkerHoldingTheLongestPrefix) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill);
  AddWorker("p2", WorkerRole::kPrefill);
  AddWorker("p3", WorkerRole::kPrefill);
  const auto prompt = Prompt(1024);
  Report("p1", prompt, 8);
  Report("p2", prompt, 40);
  Report("p3", Prompt(1024, 5000), 60);  // another prompt's blocks
  PlacementPolicy policy({.disaggregation_threshold_tokens = 64});
  const auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_FALSE(placement->prefill_locally);
  EXPECT_EQ(placement->prefill_worker_id, "p2");
  EXPECT_EQ(placement->prefill_address, "p2:1");
  EXPECT_EQ(placement->prefill_cached_tokens, 40 * kBlock);
  EXPECT_EQ(placement->decode_worker_id, "d");
  EXPECT_EQ(placement->decode_cached_tokens, 0);
  EXPECT_NE(placement->reason.find("prefill=p2"), std::string::npos) << placement->reason;
}

TEST_F(PlacementPolicyTest, PrefixMatchesAlsoWorkFromBlockHashes) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill);
  AddWorker("p2", WorkerRole::kPrefill);
  const auto prompt = Prompt(1000);  // 62 full blocks + 8 tokens
  Report("p1", prompt, 62);
  const PlacementRequest request{
      .model = "m", .prompt_block_hashes = kv::HashFullBlocks(prompt, kBlock, 0), .prompt_length_tokens = 1000};
  const auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 0}).Place(request, registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->prefill_worker_id, "p1");
  EXPECT_EQ(placement->prefill_cached_tokens, 62 * kBlock);
}

// Fails if placement hashed the prompt without the salt: a salted request would look
// like a miss on the worker holding its blocks and a hit on one holding another's.
TEST_F(PlacementPolicyTest, PrefixMatchesOnlyBlocksOfTheRequestsCacheSalt) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("pa", WorkerRole::kPrefill);
  AddWorker("pn", WorkerRole::kPrefill);
  const auto prompt = Prompt(1024);
  Report("pa", prompt, 40, {}, kv::Tier::kDevice, "tenant-a");
  Report("pn", prompt, 20);  // the same tokens, cached by unsalted requests
  const PlacementPolicy policy({.disaggregation_threshold_tokens = 64});
  auto place = [&](std::string salt) {
    PlacementRequest request = Request(prompt);
    request.cache_salt = std::move(salt);
    return policy.Place(request, registry_);
  };
  const auto tenant_a = place("tenant-a");
  ASSERT_TRUE(tenant_a.ok()) << tenant_a.status();
  EXPECT_EQ(tenant_a->prefill_worker_id, "pa");
  EXPECT_EQ(tenant_a->prefill_cached_tokens, 40 * kBlock);
  const auto tenant_b = place("tenant-b");
  ASSERT_TRUE(tenant_b.ok()) << tenant_b.status();
  EXPECT_EQ(tenant_b->prefill_cached_tokens, 0);
  EXPECT_EQ(tenant_b->decode_cached_tokens, 0);
  const auto unsalted = place("");
  ASSERT_TRUE(unsalted.ok()) << unsalted.status();
  EXPECT_EQ(unsalted->prefill_worker_id, "pn");
  EXPECT_EQ(unsalted->prefill_cached_tokens, 20 * kBlock);
}

TEST_F(PlacementPolicyTest, AnOverloadedWorkerLosesItsPrefixAdvantage) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill);
  AddWorker("p2", WorkerRole::kPrefill);
  const auto prompt = Prompt(1024);
  // p2 holds the whole prompt but its KV pool is full; p1 holds a little and is idle.
  Report("p1", prompt, 4, WorkerLoad{.kv_blocks_total = 1000, .kv_blocks_used = 100});
  Report("p2", prompt, 64, WorkerLoad{.kv_blocks_total = 1000, .kv_blocks_used = 990});
  PlacementPolicy policy({.disaggregation_threshold_tokens = 64});
  auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->prefill_worker_id, "p1");
  // And by queue depth: p2 recovered its memory but has a long queue.
  Report("p2", prompt, 0, WorkerLoad{.num_waiting_seqs = 80, .kv_blocks_total = 1000, .kv_blocks_used = 100});
  placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p1");
}

TEST_F(PlacementPolicyTest, LoadWeighsAgainstOverlapBelowOverload) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill, /*max_num_seqs=*/100);
  AddWorker("p2", WorkerRole::kPrefill, /*max_num_seqs=*/100);
  const auto prompt = Prompt(1024);  // 64 blocks
  Report("p1", prompt, 0);
  Report("p2", prompt, 16, WorkerLoad{.num_waiting_seqs = 60});  // 25% cached, 60% queued
  // Default weights: p2 scores 0.25 - 0.5 * 0.6 = -0.05 < p1's 0.
  auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 64}).Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p1");
  // Weighing the cache more flips it.
  placement = PlacementPolicy({.overlap_weight = 2.0, .disaggregation_threshold_tokens = 64})
                  .Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p2");
}

TEST_F(PlacementPolicyTest, ShortUncachedPromptsArePrefilledOnTheDecodeWorker) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p", WorkerRole::kPrefill);
  PlacementPolicy policy({.disaggregation_threshold_tokens = 128});
  auto placement = policy.Place(Request(Prompt(100)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->prefill_locally);
  EXPECT_EQ(placement->prefill_worker_id, "d");
  EXPECT_EQ(placement->decode_worker_id, "d");
  EXPECT_NE(placement->reason.find("threshold"), std::string::npos) << placement->reason;
  // Long prompt: disaggregated.
  const auto long_prompt = Prompt(1000);
  placement = policy.Place(Request(long_prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_FALSE(placement->prefill_locally);
  EXPECT_EQ(placement->prefill_worker_id, "p");
  // Long prompt mostly cached on the decode worker: only the uncached part counts.
  Report("d", long_prompt, 60);  // 960 of 1000 tokens
  placement = policy.Place(Request(long_prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->prefill_locally);
  EXPECT_EQ(placement->decode_cached_tokens, 960);
}

TEST_F(PlacementPolicyTest, UcxWhenBothSidesHaveItElseTheGrpcStream) {
  AddWorker("d", WorkerRole::kDecode, 64, {.grpc_stream = true, .ucx = true});
  AddWorker("p", WorkerRole::kPrefill, 64, {.grpc_stream = true, .ucx = true});
  PlacementPolicy policy({.disaggregation_threshold_tokens = 0});
  auto placement = policy.Place(Request(Prompt(1000)), registry_);
  ASSERT_TRUE(placement.ok());
  ASSERT_FALSE(placement->prefill_locally);
  EXPECT_EQ(placement->kv_transport, KvTransportKind::kUcx);
  EXPECT_NE(placement->reason.find("kv=ucx"), std::string::npos) << placement->reason;
  // The prefill worker re-registers without UCX: the pair falls back to the gRPC stream.
  ASSERT_TRUE(registry_.Deregister("p").ok());
  AddWorker("p", WorkerRole::kPrefill, 64, {.grpc_stream = true, .ucx = false});
  placement = policy.Place(Request(Prompt(1000)), registry_);
  ASSERT_TRUE(placement.ok());
  ASSERT_FALSE(placement->prefill_locally);
  EXPECT_EQ(placement->kv_transport, KvTransportKind::kGrpcStream);
}

TEST_F(PlacementPolicyTest, TensorParallelSizesThatDifferPrefillLocallySayingWhy) {
  // Workers of one model may differ in TP (the registry takes both); KV moves rank to
  // rank, so only a pair of equal sizes disaggregates.
  AddWorker("d", WorkerRole::kDecode, 64, {.grpc_stream = true, .ucx = true}, /*tp_size=*/2);
  AddWorker("p", WorkerRole::kPrefill, 64, {.grpc_stream = true, .ucx = true}, /*tp_size=*/1);
  PlacementPolicy policy({.disaggregation_threshold_tokens = 0});
  auto placement = policy.Place(Request(Prompt(1000)), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_TRUE(placement->prefill_locally);
  EXPECT_NE(placement->reason.find("tensor-parallel size 1"), std::string::npos) << placement->reason;
  ASSERT_TRUE(registry_.Deregister("p").ok());
  AddWorker("p", WorkerRole::kPrefill, 64, {.grpc_stream = true, .ucx = true}, /*tp_size=*/2);
  placement = policy.Place(Request(Prompt(1000)), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_FALSE(placement->prefill_locally) << placement->reason;
  EXPECT_EQ(placement->kv_transport, KvTransportKind::kUcx);
}

TEST_F(PlacementPolicyTest, APairSharingNoKvTransportPrefillsLocally) {
  AddWorker("d", WorkerRole::kDecode, 64, {.grpc_stream = false, .ucx = true});
  AddWorker("p", WorkerRole::kPrefill, 64, {.grpc_stream = true, .ucx = false});
  const auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 0}).Place(Request(Prompt(1000)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->prefill_locally);
  EXPECT_NE(placement->reason.find("share no KV transport"), std::string::npos) << placement->reason;
}

TEST_F(PlacementPolicyTest, WithoutPrefillWorkersTheDecodeWorkerPrefills) {
  AddWorker("d", WorkerRole::kDecode);
  const auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 0}).Place(Request(Prompt(4096)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->prefill_locally);
  EXPECT_NE(placement->reason.find("no prefill-capable worker"), std::string::npos);
}

TEST_F(PlacementPolicyTest, AggregatedWorkerHoldingThePrefixDoesBoth) {
  AddWorker("a", WorkerRole::kBoth);
  AddWorker("b", WorkerRole::kBoth);
  const auto prompt = Prompt(1024);
  Report("b", prompt, 64);
  const auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 0}).Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "b");
  EXPECT_TRUE(placement->prefill_locally);
}

TEST_F(PlacementPolicyTest, RecentPlacementsSpreadABurstBetweenHeartbeats) {
  AddWorker("d1", WorkerRole::kDecode, /*max_num_seqs=*/4);
  AddWorker("d2", WorkerRole::kDecode, /*max_num_seqs=*/4);
  PlacementPolicy policy;
  std::vector<std::string> chosen;
  for (int i = 0; i < 4; ++i) {
    const auto placement = policy.Place(Request(Prompt(32, 100 * i)), registry_);
    ASSERT_TRUE(placement.ok());
    chosen.push_back(placement->decode_worker_id);
  }
  EXPECT_EQ(chosen, (std::vector<std::string>{"d1", "d2", "d1", "d2"}));
}

TEST_F(PlacementPolicyTest, HostTierHitsCountLessThanDeviceHits) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill);
  AddWorker("p2", WorkerRole::kPrefill);
  const auto prompt = Prompt(1024);
  Report("p1", prompt, 40, {}, kv::Tier::kHost);    // 40 * 0.8 = 32 effective
  Report("p2", prompt, 36, {}, kv::Tier::kDevice);  // 36
  auto placement = PlacementPolicy({.disaggregation_threshold_tokens = 0}).Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p2");
  placement = PlacementPolicy({.host_tier_weight = 1.0, .disaggregation_threshold_tokens = 0})
                  .Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p1");
}

// The spec AddWorker registers: 2 layers x 2 kv heads x 16 tokens x 8 dims x bf16 x (K,V).
constexpr int64_t kBlockBytes = 2 * 2 * 16 * 8 * 2 * 2;

// A load whose measured host-tier bandwidth makes loading a block take `host_fraction`
// of recomputing it (prefill at 1000 tokens/s: 16 ms per block).
WorkerLoad MeasuredLoad(double host_fraction, double disk_fraction) {
  const double recompute_seconds = 16.0 / 1000.0;
  return WorkerLoad{.kv_host_read_bytes_per_second = kBlockBytes / (host_fraction * recompute_seconds),
                    .kv_disk_read_bytes_per_second = kBlockBytes / (disk_fraction * recompute_seconds),
                    .prefill_tokens_per_second = 1000.0};
}

TEST_F(PlacementPolicyTest, MeasuredHostBandwidthDecidesBetweenHostAndDeviceHits) {
  AddWorker("d", WorkerRole::kDecode);
  AddWorker("p1", WorkerRole::kPrefill);
  AddWorker("p2", WorkerRole::kPrefill);
  const auto prompt = Prompt(1024);
  const PlacementPolicy policy({.disaggregation_threshold_tokens = 0});
  // Fast host tier: a host block is worth 0.95 of a device block: 40 * 0.95 = 38 > 36.
  Report("p1", prompt, 40, MeasuredLoad(0.05, 0.5), kv::Tier::kHost);
  Report("p2", prompt, 36, MeasuredLoad(0.05, 0.5), kv::Tier::kDevice);
  auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p1") << placement->reason;
  // The same hits once p1 measures a slow host tier (worth 0.5): 20 < 36.
  Report("p1", prompt, 0, MeasuredLoad(0.5, 0.9));
  placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->prefill_worker_id, "p2") << placement->reason;
}

TEST(PlacementPolicyScoreTest, TierWeightsComeFromMeasurementsWithConstantsAsFallback) {
  const PlacementPolicy policy({.host_tier_weight = 0.8, .disk_tier_weight = 0.5});
  bool measured = true;
  // Unmeasured: the constants.
  EXPECT_DOUBLE_EQ(policy.TierBlockWeight(kv::Tier::kHost, WorkerLoad{}, kBlockBytes, 16, &measured), 0.8);
  EXPECT_FALSE(measured);
  EXPECT_DOUBLE_EQ(policy.TierBlockWeight(kv::Tier::kDisk, WorkerLoad{.kv_disk_read_bytes_per_second = 1e9},
                                          kBlockBytes, 16, &measured),
                   0.5);  // bandwidth without a prefill speed is not enough
  EXPECT_FALSE(measured);
  // Measured: 1 - load time / recompute time.
  const WorkerLoad load = MeasuredLoad(0.25, 0.75);
  EXPECT_NEAR(policy.TierBlockWeight(kv::Tier::kHost, load, kBlockBytes, 16, &measured), 0.75, 1e-9);
  EXPECT_TRUE(measured);
  EXPECT_NEAR(policy.TierBlockWeight(kv::Tier::kDisk, load, kBlockBytes, 16, &measured), 0.25, 1e-9);
  EXPECT_DOUBLE_EQ(policy.TierBlockWeight(kv::Tier::kDevice, load, kBlockBytes, 16, &measured), 1.0);
  // A tier slower than recomputing is worth nothing (the worker recomputes).
  EXPECT_DOUBLE_EQ(policy.TierBlockWeight(kv::Tier::kDisk, MeasuredLoad(0.25, 3.0), kBlockBytes, 16, &measured), 0.0);
  EXPECT_TRUE(measured);
}

// The score of a worker holding the first `blocks` blocks of a 256-token prompt on `tier`.
WorkerScore ScoreOf(const PlacementPolicy& policy, const WorkerLoad& load, kv::Tier tier, int32_t blocks) {
  WorkerCandidate c;
  c.worker.registration.kv_cache_spec =
      KvCacheSpec{.block_size_tokens = 16, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8};
  c.worker.registration.capacity.max_num_seqs = 10;
  c.worker.load = load;
  c.prefix.num_blocks = blocks;
  c.prefix.num_blocks_by_tier[static_cast<int>(tier)] = blocks;
  return policy.Score(c, /*prompt_length_tokens=*/256, /*block_size_tokens=*/16);
}

TEST(PlacementPolicyScoreTest, DeviceBeatsHostBeatsDiskBeatsRecompute) {
  const PlacementPolicy policy;
  auto score = [&](kv::Tier tier, int32_t blocks) { return ScoreOf(policy, MeasuredLoad(0.1, 0.6), tier, blocks); };
  const WorkerScore device = score(kv::Tier::kDevice, 16), host = score(kv::Tier::kHost, 16),
                    disk = score(kv::Tier::kDisk, 16), none = score(kv::Tier::kDevice, 0);
  EXPECT_TRUE(host.measured_tier_weights);
  EXPECT_GT(device.score, host.score);
  EXPECT_GT(host.score, disk.score);
  EXPECT_GT(disk.score, none.score);
  EXPECT_NEAR(host.cached_fraction, 0.9, 1e-9);
  EXPECT_NEAR(disk.cached_fraction, 0.4, 1e-9);
  // Expected prefill time: 0 for a full device hit, the whole recompute (256 ms) for none.
  EXPECT_NEAR(device.expected_prefill_seconds, 0.0, 1e-12);
  EXPECT_NEAR(host.expected_prefill_seconds, 0.1 * 0.256, 1e-9);
  EXPECT_NEAR(disk.expected_prefill_seconds, 0.6 * 0.256, 1e-9);
  EXPECT_NEAR(none.expected_prefill_seconds, 0.256, 1e-9);
}

// A block the cluster kv-store holds counts for every worker with the store's key space,
// weighed by that worker's measured store bandwidth: between a local host hit and
// recomputing.
TEST(PlacementPolicyScoreTest, AStoreHitWeighsBetweenAHostHitAndRecompute) {
  const PlacementPolicy policy;
  WorkerLoad load = MeasuredLoad(0.1, 0.6);
  // The store's measured bandwidth: a block loads in 0.3 of its recompute time.
  load.kv_store_read_bytes_per_second = kBlockBytes / (0.3 * 16.0 / 1000.0);
  auto score = [&](kv::Tier tier, int32_t blocks) { return ScoreOf(policy, load, tier, blocks); };
  const WorkerScore host = score(kv::Tier::kHost, 16), store = score(kv::Tier::kStore, 16),
                    none = score(kv::Tier::kDevice, 0);
  EXPECT_NEAR(store.store_block_weight, 0.7, 1e-9);
  EXPECT_NEAR(store.cached_fraction, 0.7, 1e-9);
  EXPECT_GT(host.score, store.score);
  EXPECT_GT(store.score, none.score);
  // Unmeasured, the constant stands in.
  bool measured = true;
  EXPECT_DOUBLE_EQ(policy.TierBlockWeight(kv::Tier::kStore, WorkerLoad{}, kBlockBytes, 16, &measured), 0.4);
  EXPECT_FALSE(measured);
}

// End to end through the registry: the store's events make a worker with its key space
// a better placement than one without, and a worker holding the prefix locally better
// still; when the store restarts (a new epoch) its blocks stop counting.
TEST_F(PlacementPolicyTest, StoreResidencyCountsForWorkersWithItsKeySpace) {
  constexpr kv::SharedKeySpace kSpace{.low = 3, .high = 4};
  auto add = [&](const std::string& id, bool with_store) {
    const WorkerRegistration r{
        .worker_id = id,
        .address = absl::StrCat(id, ":1"),
        .role = WorkerRole::kBoth,
        .model = "m",
        .kv_cache_spec = KvCacheSpec{.block_size_tokens = kBlock, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8},
        .capacity = WorkerCapacity{.max_num_seqs = 64},
        .kv_store_key_spaces = with_store ? std::vector<kv::SharedKeySpace>{kSpace} : std::vector<kv::SharedKeySpace>{}};
    ASSERT_TRUE(registry_.Register(r).ok());
  };
  add("a-plain", false);
  add("b-store", true);
  const auto prompt = Prompt(512);
  const auto hashes = kv::HashFullBlocks(prompt, kBlock, 0);
  kv_store::StoreEventsPage page{.epoch = 77};
  for (const kv::BlockHash& h : hashes) page.events.push_back({.key = kv_store::StoreKeySpace::FromId(kSpace).Key(h)});
  registry_.ApplyStoreEvents("store:1", page);
  const PlacementPolicy policy({.disaggregation_threshold_tokens = 0});
  auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "b-store") << placement->reason;
  EXPECT_EQ(placement->decode_cached_tokens, 512) << "store blocks are loadable, so cached";
  const std::vector<WorkerCandidate> candidates = registry_.Candidates("m", hashes);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].prefix.num_blocks, 0);
  EXPECT_EQ(candidates[1].prefix.num_blocks_by_tier[static_cast<int>(kv::Tier::kStore)], 32);
  // A third worker with the prefix on its host tier wins over the store's.
  add("c-host", true);
  Report("c-host", prompt, 32, {}, kv::Tier::kHost);
  placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "c-host") << placement->reason;
  // The store restarts empty: its previous life's blocks no longer draw requests.
  registry_.ApplyStoreEvents("store:1", kv_store::StoreEventsPage{.epoch = 78, .reset = true});
  EXPECT_EQ(registry_.Candidates("m", hashes)[1].prefix.num_blocks, 0);
  EXPECT_EQ(registry_.stats().num_store_keys, 0);
}

TEST_F(PlacementPolicyTest, RoundRobinIgnoresPrefixesAndCyclesThroughTheWorkers) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  AddWorker("d3", WorkerRole::kDecode);
  const auto prompt = Prompt(512);
  Report("d2", prompt, 32);  // kv-aware would always pick d2
  PlacementPolicy policy({.strategy = PlacementStrategy::kRoundRobin, .disaggregation_threshold_tokens = 64});
  std::vector<std::string> chosen;
  for (int i = 0; i < 6; ++i) {
    const auto placement = policy.Place(Request(prompt), registry_);
    ASSERT_TRUE(placement.ok()) << placement.status();
    chosen.push_back(placement->decode_worker_id);
  }
  EXPECT_EQ(chosen, (std::vector<std::string>{"d1", "d2", "d3", "d1", "d2", "d3"}));
  PlacementPolicy kv_aware({.disaggregation_threshold_tokens = 64});
  const auto placement = kv_aware.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->decode_worker_id, "d2");
}

TEST_F(PlacementPolicyTest, LeastLoadedPicksTheFewestPendingRequests) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  const auto prompt = Prompt(512);
  Report("d1", prompt, 32, WorkerLoad{.num_waiting_seqs = 5});
  Report("d2", Prompt(16, 9000), 1, WorkerLoad{.num_waiting_seqs = 1});
  PlacementPolicy policy({.strategy = PlacementStrategy::kLeastLoaded, .disaggregation_threshold_tokens = 64});
  const auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->decode_worker_id, "d2");
}

TEST(PlacementStrategyTest, ParsesTheFlagsNamesAndRefusesOthers) {
  EXPECT_EQ(*ParsePlacementStrategy("kv-aware"), PlacementStrategy::kKvAware);
  EXPECT_EQ(*ParsePlacementStrategy("round-robin"), PlacementStrategy::kRoundRobin);
  EXPECT_EQ(*ParsePlacementStrategy("least-loaded"), PlacementStrategy::kLeastLoaded);
  const auto bad = ParsePlacementStrategy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--placement-strategy"), std::string::npos);
}

TEST_F(PlacementPolicyTest, ExpiredWorkersAreNotPlaced) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  const auto prompt = Prompt(256);
  Report("d1", prompt, 16);
  PlacementPolicy policy;
  ASSERT_EQ(policy.Place(Request(prompt), registry_)->decode_worker_id, "d1");
  clock_.Advance(absl::Milliseconds(700));
  ASSERT_TRUE(registry_.Heartbeat("d2", {}).ok());
  clock_.Advance(absl::Milliseconds(700));  // d1: 1400 ms since its heartbeat
  const auto placement = policy.Place(Request(prompt), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "d2");
}

TEST(PlacementPolicyScoreTest, ScoreCombinesOverlapQueueAndKvUsage) {
  PlacementPolicy policy({.overlap_weight = 1.0, .queue_weight = 0.5, .kv_usage_weight = 0.25});
  WorkerCandidate c;
  c.worker.registration.capacity.max_num_seqs = 10;
  c.worker.load = WorkerLoad{.num_waiting_seqs = 2, .kv_blocks_total = 100, .kv_blocks_used = 40, .queue_depth = 1};
  c.worker.num_recent_placements = 1;
  c.prefix.num_blocks = 4;
  c.prefix.num_blocks_by_tier[0] = 4;
  const WorkerScore s = policy.Score(c, /*prompt_length_tokens=*/128, /*block_size_tokens=*/16);
  EXPECT_EQ(s.cached_tokens, 64);
  EXPECT_DOUBLE_EQ(s.cached_fraction, 0.5);
  EXPECT_DOUBLE_EQ(s.pending_ratio, 0.4);
  EXPECT_DOUBLE_EQ(s.kv_usage, 0.4);
  EXPECT_FALSE(s.overloaded);
  EXPECT_DOUBLE_EQ(s.score, 0.5 - 0.2 - 0.1);
}

}  // namespace
}  // namespace kvmesh::cluster

namespace kvmesh::cluster {
namespace {

// Registry + policy under concurrent heartbeats, placements, listings and expiry: no
// crash, no lost worker, every placement names a live worker.
TEST(PlacementConcurrencyTest, ConcurrentHeartbeatsPlacementsAndListings) {
  ManualClock clock;
  WorkerRegistry registry({.heartbeat_interval_ms = 10, .worker_ttl_ms = 1000, .clock = &clock});
  for (int w = 0; w < 4; ++w) {
    ASSERT_TRUE(registry
                    .Register({.worker_id = absl::StrCat("w", w),
                               .address = absl::StrCat("w", w, ":1"),
                               .role = w % 2 == 0 ? WorkerRole::kDecode : WorkerRole::kPrefill,
                               .model = "m",
                               .kv_cache_spec = KvCacheSpec{.block_size_tokens = kBlock}})
                    .ok());
  }
  const PlacementPolicy policy({.disaggregation_threshold_tokens = 16});
  std::atomic<bool> stop{false};
  std::atomic<int> placed{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      const auto hashes = kv::HashFullBlocks(Prompt(512, w * 7), kBlock, 0);
      int i = 0;
      while (!stop.load()) {
        HeartbeatReport report;
        report.load.num_waiting_seqs = i % 5;
        const auto& h = hashes[static_cast<size_t>(i) % hashes.size()];
        report.kv_events.push_back({.kind = i % 3 == 0 ? kv::KvEvent::Kind::kRemoved : kv::KvEvent::Kind::kStored,
                                    .block_hash = h,
                                    .num_tokens = kBlock});
        EXPECT_TRUE(registry.Heartbeat(absl::StrCat("w", w), report).ok());
        ++i;
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        const PlacementRequest request{.model = "m", .prompt_token_ids = Prompt(512, t * 7)};
        const auto placement = policy.Place(request, registry);
        EXPECT_TRUE(placement.ok()) << placement.status();
        if (placement.ok()) ++placed;
        EXPECT_EQ(registry.List("m").size(), 4u);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_GT(placed.load(), 0);
}

// With in-flight records on (the registry's default is 30 s; 500 ms here, inside the
// workers' 1 s lease so expiry can be stepped over).
class InFlightPlacementTest : public PlacementPolicyTest {
 protected:
  InFlightPlacementTest() : PlacementPolicyTest(/*in_flight_prefix_ttl_ms=*/500) {}

  // A prompt of `tenant`'s 40-block system prompt plus a user turn of its own.
  static std::vector<int32_t> TenantPrompt(int32_t tenant, int32_t turn) {
    std::vector<int32_t> tokens = Prompt(40 * kBlock, 1 + 10'000 * tenant);
    const std::vector<int32_t> user = Prompt(24, 5'000 + 100 * turn + 10'000 * tenant);
    tokens.insert(tokens.end(), user.begin(), user.end());
    return tokens;
  }
};

// The regression: before in-flight records, the second request of a prefix arriving
// while the first one's prefill was running (no KV event reported yet) went by load to
// the other worker, and from then on both workers cached that prefix.
TEST_F(InFlightPlacementTest, ATenantsSecondRequestFollowsItsFirstBeforeItsBlocksAreReported) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  PlacementPolicy policy;
  auto first = policy.Place(Request(TenantPrompt(0, 0)), registry_);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string home = first->decode_worker_id;
  const std::string other = home == "d1" ? "d2" : "d1";
  // The home worker is busy prefilling it (KV in use, nothing reported stored yet);
  // the other worker is idle.
  Report(home, {}, 0, WorkerLoad{.num_running_seqs = 1, .kv_blocks_total = 100, .kv_blocks_used = 41});
  Report(other, {}, 0, WorkerLoad{.kv_blocks_total = 100});
  auto second = policy.Place(Request(TenantPrompt(0, 1)), registry_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->decode_worker_id, home) << second->reason;
  EXPECT_EQ(second->decode_cached_tokens, 0);  // in flight, not cached: nothing claimed
  EXPECT_NE(second->reason.find("in_flight=40"), std::string::npos) << second->reason;
  // Another tenant, unknown everywhere, goes by load to the idle worker.
  auto stranger = policy.Place(Request(TenantPrompt(1, 0)), registry_);
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(stranger->decode_worker_id, other) << stranger->reason;
}

TEST_F(InFlightPlacementTest, ReportedBlocksTakeOverAndAnUnreportedRecordExpires) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  PlacementPolicy policy;
  const auto prompt = TenantPrompt(0, 0);
  ASSERT_EQ(policy.Place(Request(prompt), registry_)->decode_worker_id, "d1");
  const WorkerLoad busy{.num_running_seqs = 1, .kv_blocks_total = 100, .kv_blocks_used = 60};
  // d1 reports the first 10 blocks: 10 cached, the next 30 still in flight.
  Report("d1", prompt, 10, busy);
  Report("d2", {}, 0, WorkerLoad{.kv_blocks_total = 100});
  auto placement = policy.Place(Request(TenantPrompt(0, 1)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "d1") << placement->reason;
  EXPECT_EQ(placement->decode_cached_tokens, 10 * kBlock);
  EXPECT_NE(placement->reason.find("in_flight=30"), std::string::npos) << placement->reason;
  // The requests died before computing the rest: past the deadline only the 10 reported
  // blocks count (0.24 of the prompt), less than d1's load (0.3), so the idle d2 wins.
  clock_.Advance(absl::Milliseconds(600));
  Report("d1", {}, 0, busy);
  Report("d2", {}, 0, WorkerLoad{.kv_blocks_total = 100});
  placement = policy.Place(Request(TenantPrompt(0, 2)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "d2") << placement->reason;
}

TEST_F(InFlightPlacementTest, AnEvictedPrefixIsSeenAtOnceDespiteARecentPlacement) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  PlacementPolicy policy;
  const auto prompt = TenantPrompt(0, 0);
  Report("d1", prompt, 40);  // d1 holds the whole system prompt
  ASSERT_EQ(policy.Place(Request(prompt), registry_)->decode_worker_id, "d1");
  // Then evicts it (a placement of a held prefix records nothing for the held blocks).
  HeartbeatReport evicted;
  const auto hashes = kv::HashFullBlocks(prompt, kBlock, 0);
  for (int i = 0; i < 40; ++i) {
    evicted.kv_events.push_back({.kind = kv::KvEvent::Kind::kRemoved, .block_hash = hashes[i], .num_tokens = kBlock});
  }
  evicted.load = WorkerLoad{.num_waiting_seqs = 2, .kv_blocks_total = 100};
  ASSERT_TRUE(registry_.Heartbeat("d1", evicted).ok());
  const auto placement = policy.Place(Request(TenantPrompt(0, 1)), registry_);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode_worker_id, "d2") << placement->reason;
}

TEST_F(InFlightPlacementTest, RoundRobinStillIgnoresThem) {
  AddWorker("d1", WorkerRole::kDecode);
  AddWorker("d2", WorkerRole::kDecode);
  PlacementPolicy policy({.strategy = PlacementStrategy::kRoundRobin});
  std::vector<std::string> chosen;
  for (int turn = 0; turn < 4; ++turn) {
    chosen.push_back(policy.Place(Request(TenantPrompt(0, turn)), registry_)->decode_worker_id);
  }
  EXPECT_EQ(chosen, (std::vector<std::string>{"d1", "d2", "d1", "d2"}));
}

}  // namespace
}  // namespace kvmesh::cluster
