// KvRankGroupPush / OpenRankGroupLease between two tensor-parallel groups of two ranks,
// each rank its own real UcxKvTransport (its own context, worker and progress thread)
// over shared memory: rank r's blocks land in the peer's rank r only, the group reports
// once, and a failure on one rank fails the group and stops the other rank.
#include "kv/transport/kv_rank_group.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_layout.h"
#include "kv/transport/ucx/ucx_kv_transport.h"

namespace kvmesh::kv {
namespace {

using std::chrono::seconds;

constexpr int32_t kRanks = 2;
constexpr int32_t kLayers = 3;

KvLayoutOptions Shape(int32_t num_blocks) {
  return KvLayoutOptions{.num_layers = kLayers, .num_kv_heads = 2, .head_dim = 32, .block_size_tokens = 16,
                         .dtype = DType::kBF16, .num_blocks = num_blocks};
}

std::vector<BlockId> Ids(std::initializer_list<int32_t> v) {
  std::vector<BlockId> out;
  for (int32_t x : v) out.push_back(BlockId{x});
  return out;
}

struct Outcome {
  std::promise<std::pair<absl::Status, KvTransferStats>> promise;
  std::future<std::pair<absl::Status, KvTransferStats>> future = promise.get_future();
  int calls = 0;  // only the promise's first set_value may happen: a second throws
  std::function<void(const absl::Status&, const KvTransferStats&)> Fn() {
    return [this](const absl::Status& s, const KvTransferStats& st) {
      ++calls;
      promise.set_value({s, st});
    };
  }
  std::pair<absl::Status, KvTransferStats> Get() {
    if (future.wait_for(seconds(10)) != std::future_status::ready) {
      return {absl::DeadlineExceededError("test: no outcome within 10 s"), {}};
    }
    return future.get();
  }
};

// One side's group: a transport and a pool per rank.
struct Group {
  std::vector<std::unique_ptr<UcxKvTransport>> transports;
  std::vector<std::unique_ptr<KvStorage>> pools;
  std::vector<KvRankPool> ranks;

  static Group Make(int32_t num_blocks, uint32_t seed) {
    Group g;
    for (int32_t r = 0; r < kRanks; ++r) {
      UcxKvTransportOptions o{.tls = "sm", .progress_timeout_ms = 300, .hello_timeout_ms = 300,
                              .keepalive_interval_ms = 50, .receiver_timeout_ms = 300, .ack_timeout_ms = 500,
                              .checksum_runs = true};
      g.transports.push_back(UcxKvTransport::Create(o).value());
      g.pools.push_back(KvStorage::Create(Shape(num_blocks)).value());
      if (seed != 0) {
        std::mt19937 rng(seed + static_cast<uint32_t>(r));
        auto* p = reinterpret_cast<uint32_t*>(g.pools.back()->data());
        for (int64_t i = 0; i < g.pools.back()->size_bytes() / 4; ++i) p[i] = rng();
      }
      const KvPoolHandle pool =
          g.transports.back()->RegisterPool(g.pools.back()->data(), g.pools.back()->layout()).value();
      g.ranks.push_back({.transport = g.transports.back().get(), .pool = pool});
    }
    return g;
  }
};

uint64_t Hash(std::span<const std::byte> b) { return XXH64(b.data(), b.size(), 0); }

TEST(KvRankGroupTest, EachRankLandsInThePeersSameRank) {
  Group receiver = Group::Make(32, 0);
  Group sender = Group::Make(32, 11);
  const auto dst = Ids({4, 5, 6, 20});
  const auto src = Ids({1, 2, 3, 9});
  Outcome lease, push_done;
  auto grant = OpenRankGroupLease(receiver.ranks, dst, lease.Fn());
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_EQ(grant->descriptors.size(), static_cast<size_t>(kRanks));
  auto push = KvRankGroupPush::Open(sender.ranks, grant->descriptors);
  ASSERT_TRUE(push.ok()) << push.status();
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t r = 0; r < kRanks; ++r) ASSERT_TRUE((*push)->PutLayer(r, layer, 0, src).ok());
  }
  EXPECT_EQ((*push)->PutLayer(kRanks, 0, 0, src).code(), absl::StatusCode::kInvalidArgument);
  (*push)->Finish(push_done.Fn());
  const auto [push_status, push_stats] = push_done.Get();
  ASSERT_TRUE(push_status.ok()) << push_status;
  const auto [lease_status, lease_stats] = lease.Get();
  ASSERT_TRUE(lease_status.ok()) << lease_status;
  const int64_t block_bytes = sender.pools[0]->layout().BlockBytes();
  EXPECT_EQ(push_stats.bytes, int64_t{kRanks} * kLayers * 4 * block_bytes);
  EXPECT_EQ(push_stats.blocks, int64_t{kRanks} * kLayers * 4);
  // Two merged runs per layer and rank: [1,2,3] -> [4,5,6], [9] -> [20].
  EXPECT_EQ(push_stats.descriptors, int64_t{kRanks} * kLayers * 2);
  for (int32_t r = 0; r < kRanks; ++r) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      for (size_t i = 0; i < src.size(); ++i) {
        const uint64_t sent = Hash(sender.pools[r]->BlockData(layer, src[i]));
        EXPECT_EQ(Hash(receiver.pools[r]->BlockData(layer, dst[i])), sent) << "rank " << r << " layer " << layer;
        // The other rank's heads differ (another seed): a crossed rank would show.
        EXPECT_NE(Hash(receiver.pools[1 - r]->BlockData(layer, dst[i])), sent);
      }
    }
  }
  EXPECT_EQ(lease.calls, 1);
  EXPECT_EQ(push_done.calls, 1);
}

TEST(KvRankGroupTest, ADescriptorCountOtherThanTheRanksIsRefused) {
  Group receiver = Group::Make(8, 0);
  Group sender = Group::Make(8, 3);
  Outcome lease;
  auto grant = OpenRankGroupLease(std::span(receiver.ranks).first(1), Ids({1}), lease.Fn());
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto push = KvRankGroupPush::Open(sender.ranks, grant->descriptors);
  ASSERT_EQ(push.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(push.status().message().find("tensor-parallel"), std::string::npos) << push.status();
  CloseRankGroupLease(receiver.ranks, grant->lease_tokens, absl::CancelledError("test over"));
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);
}

TEST(KvRankGroupTest, OneRanksLeaseClosedFailsTheGroupOnceAndStopsTheOtherRank) {
  Group receiver = Group::Make(16, 0);
  Group sender = Group::Make(16, 5);
  const auto ids = Ids({1, 2});
  Outcome lease, push_done;
  auto grant = OpenRankGroupLease(receiver.ranks, ids, lease.Fn());
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto push = KvRankGroupPush::Open(sender.ranks, grant->descriptors);
  ASSERT_TRUE(push.ok()) << push.status();
  ASSERT_TRUE((*push)->PutLayer(0, 0, 0, ids).ok());
  // Rank 1's lease alone ends (its blocks went away): the group lease fails with it,
  // closing rank 0's too, and the sender's group fails rather than waiting for acks.
  receiver.ranks[1].transport->CloseLease(grant->lease_tokens[1], absl::AbortedError("rank 1 gave up"));
  const auto [lease_status, lease_stats] = lease.Get();
  EXPECT_EQ(lease_status.code(), absl::StatusCode::kAborted) << lease_status;
  EXPECT_NE(lease_status.message().find("rank 1"), std::string::npos) << lease_status;
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t r = 0; r < kRanks; ++r) (void)(*push)->PutLayer(r, layer, 0, ids);
  }
  (*push)->Finish(push_done.Fn());
  EXPECT_FALSE(push_done.Get().first.ok());
  EXPECT_EQ(lease.calls, 1);
  EXPECT_EQ(push_done.calls, 1);
  for (const auto& t : receiver.transports) EXPECT_EQ(t->num_open_leases(), 0);
}

}  // namespace
}  // namespace kvmesh::kv
