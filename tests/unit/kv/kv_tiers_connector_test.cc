// KvTiers over more than one KvConnector (kv/kv_connector.h): each block of a prefix
// comes from the first connector that holds it, a load that fails is recomputed and
// never served, a connector still finding out reports `pending`, and saves reach every
// connector. The connectors are in memory (in_memory_kv_connector.h): the disk tier's
// own behaviour behind the interface is kv_tiers_test.cc's.
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "in_memory_kv_connector.h"
#include "kv/kv_connector.h"
#include "kv/kv_tiers.h"

namespace kvmesh::kv {
namespace {

constexpr int32_t kBlock = 4;
constexpr int64_t kSlotBytes = 64;

std::vector<BlockHash> Chain(int n) {
  std::vector<BlockHash> v;
  for (int i = 0; i < n; ++i) v.push_back(BlockHash{.low = 300 + static_cast<uint64_t>(i), .high = 5});
  return v;
}

void Put(InMemoryBlocks& b, const BlockHash& hash, std::byte fill) { b.blocks[hash].assign(kSlotBytes, fill); }

struct TwoConnectors {
  std::unique_ptr<KvTiers> tiers;
  InMemoryBlocks near_blocks, far_blocks;
  InMemoryKvConnector* near = nullptr;  // asked first (the disk, say)
  InMemoryKvConnector* far = nullptr;   // asked second (the cluster store, say)
};

std::unique_ptr<TwoConnectors> MakeTiers(int32_t host_slots) {
  auto host = HostKvTier::Create({.capacity_bytes = host_slots * kSlotBytes, .slot_bytes = kSlotBytes});
  EXPECT_TRUE(host.ok()) << host.status();
  auto out = std::make_unique<TwoConnectors>();
  auto near = std::make_unique<InMemoryKvConnector>(out->near_blocks);
  auto far = std::make_unique<InMemoryKvConnector>(out->far_blocks);
  out->near = near.get();
  out->far = far.get();
  std::vector<std::unique_ptr<KvConnector>> connectors;
  connectors.push_back(std::move(near));
  connectors.push_back(std::move(far));
  out->tiers = std::make_unique<KvTiers>(std::move(host).value(), std::move(connectors), kBlock);
  return out;
}

// The host slots of `hashes` after a lookup, which the caller releases.
std::vector<HostSlot> HostHits(KvTiers& tiers, const std::vector<BlockHash>& hashes) {
  std::vector<HostSlot> slots;
  EXPECT_EQ(tiers.ExtendPrefix(hashes, 0, hashes.size(), &slots).num_blocks, 0);
  return slots;
}

TEST(KvTiersConnectorTest, EachBlockComesFromTheFirstConnectorThatHoldsIt) {
  std::unique_ptr<TwoConnectors> p = MakeTiers(16);
  TwoConnectors& t = *p;
  const std::vector<BlockHash> chain = Chain(6);
  for (int i = 0; i < 2; ++i) Put(t.near_blocks, chain[static_cast<size_t>(i)], std::byte{1});
  for (int i = 0; i < 6; ++i) Put(t.far_blocks, chain[static_cast<size_t>(i)], std::byte{2});
  std::vector<HostSlot> none;
  const KvConnectorHits hits = t.tiers->ExtendPrefix(chain, 0, chain.size(), &none);
  EXPECT_EQ(hits.num_blocks, 6) << "the far connector continues where the near one misses";
  EXPECT_FALSE(hits.pending);
  EXPECT_EQ(t.tiers->StartLoads(RequestId{1}, chain, 0, 6).num_blocks, 6);
  t.tiers->Poll();
  EXPECT_FALSE(t.tiers->AnyLoading(chain));
  const std::vector<HostSlot> slots = HostHits(*t.tiers, chain);
  ASSERT_EQ(slots.size(), 6u);
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(t.tiers->host().data(slots[i])[0], std::byte{i < 2 ? uint8_t{1} : uint8_t{2}}) << i;
  }
  t.tiers->Release(slots);
  t.tiers->ReleaseLoadHold(RequestId{1});
  EXPECT_EQ(t.tiers->host().num_pinned(), 0);
  EXPECT_TRUE(t.tiers->CheckInvariants().ok()) << t.tiers->CheckInvariants();
}

TEST(KvTiersConnectorTest, AFailedLoadIsRecomputedNeverServed) {
  std::unique_ptr<TwoConnectors> p = MakeTiers(16);
  TwoConnectors& t = *p;
  const std::vector<BlockHash> chain = Chain(4);
  for (const BlockHash& h : chain) Put(t.far_blocks, h, std::byte{7});
  t.far_blocks.fail_loads.insert(chain[2]);
  std::vector<HostSlot> none;
  ASSERT_EQ(t.tiers->ExtendPrefix(chain, 0, chain.size(), &none).num_blocks, 4);
  EXPECT_EQ(t.tiers->StartLoads(RequestId{1}, chain, 0, 4).num_blocks, 4);
  t.tiers->Poll();
  // The host tier holds blocks 0, 1 and 3 but not 2: the prefix a lookup finds stops
  // at the failed block, whose half-written slot is gone.
  EXPECT_TRUE(t.tiers->host().Contains(chain[0]));
  EXPECT_TRUE(t.tiers->host().Contains(chain[1]));
  EXPECT_FALSE(t.tiers->host().Contains(chain[2]));
  std::vector<HostSlot> slots;
  t.far_blocks.fail_loads.clear();
  const KvConnectorHits after = t.tiers->ExtendPrefix(chain, 0, chain.size(), &slots);
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_EQ(after.num_blocks, 2) << "the failed block and the one after it are asked for again";
  t.tiers->Release(slots);
  t.tiers->ReleaseLoadHold(RequestId{1});
  EXPECT_EQ(t.tiers->host().num_pinned(), 0);
  EXPECT_TRUE(t.tiers->CheckInvariants().ok()) << t.tiers->CheckInvariants();
}

TEST(KvTiersConnectorTest, AConnectorStillFindingOutMakesTheLookupPending) {
  std::unique_ptr<TwoConnectors> p = MakeTiers(16);
  TwoConnectors& t = *p;
  const std::vector<BlockHash> chain = Chain(4);
  t.far_blocks.still_asking.insert(chain[0]);
  std::vector<HostSlot> none;
  const KvConnectorHits asking = t.tiers->ExtendPrefix(chain, 0, chain.size(), &none);
  EXPECT_EQ(asking.num_blocks, 0);
  EXPECT_TRUE(asking.pending);
  EXPECT_EQ(t.tiers->stats().lookups_pending, 1);
  // The answer came: it holds them.
  t.far_blocks.still_asking.clear();
  for (const BlockHash& h : chain) Put(t.far_blocks, h, std::byte{3});
  const KvConnectorHits known = t.tiers->ExtendPrefix(chain, 0, chain.size(), &none);
  EXPECT_EQ(known.num_blocks, 4);
  EXPECT_FALSE(known.pending);
}

TEST(KvTiersConnectorTest, OffloadedBlocksAreSavedThroughToEveryConnectorThatTakesThem) {
  std::unique_ptr<TwoConnectors> p = MakeTiers(16);
  TwoConnectors& t = *p;
  t.near->accept_saves = false;  // a connector may decline a save: the others still get it
  const std::vector<BlockHash> chain = Chain(3);
  for (size_t i = 0; i < chain.size(); ++i) {
    t.tiers->OnDeviceEvict(BlockId{static_cast<int32_t>(i)}, chain[i], i == 0 ? kRootBlockHash : chain[i - 1]);
  }
  KvSwaps swaps = t.tiers->TakeSwaps();
  ASSERT_EQ(swaps.out.size(), 3u);
  for (const KvSwap& s : swaps.out) std::memset(s.host, 9, kSlotBytes);
  t.tiers->FinishSwaps(swaps, /*copied=*/true, 1e-6, 1e-6);
  EXPECT_GT(t.tiers->host().num_pinned(), 0) << "a save in flight pins its host slot";
  t.tiers->Poll();
  for (const BlockHash& h : chain) {
    EXPECT_TRUE(t.far->Contains(h));
    EXPECT_FALSE(t.near->Contains(h));
  }
  EXPECT_EQ(t.tiers->host().num_pinned(), 0);
  EXPECT_TRUE(t.tiers->CheckInvariants().ok()) << t.tiers->CheckInvariants();
}

}  // namespace
}  // namespace kvmesh::kv
