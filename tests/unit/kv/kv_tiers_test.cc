// KvCacheManager with a host tier under its pool (kv/kv_tiers.h): offload on eviction,
// onboard on a prefix hit, the pins a lookup takes and gives back. No model: the test
// plays the runner, copying bytes between a KvStorage and the slots as a step would.
#include "kv/kv_tiers.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_layout.h"

namespace kvmesh::kv {
namespace {

constexpr int32_t kBlock = 4;

class KvTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto storage = KvStorage::Create({.num_layers = 2, .num_kv_heads = 1, .head_dim = 4,
                                      .block_size_tokens = kBlock, .dtype = DType::kF32, .num_blocks = 4});
    ASSERT_TRUE(storage.ok());
    storage_ = std::move(storage).value();
    auto kv = KvCacheManager::Create({.num_blocks = 4, .block_size_tokens = kBlock, .enable_prefix_caching = true});
    ASSERT_TRUE(kv.ok());
    kv_ = std::move(kv).value();
    auto host = HostKvTier::Create({.capacity_bytes = 8 * storage_->SwapBytesPerBlock(),
                                    .slot_bytes = storage_->SwapBytesPerBlock()});
    ASSERT_TRUE(host.ok());
    ASSERT_TRUE(kv_->AttachTiers(std::make_unique<KvTiers>(std::move(host).value(), nullptr, kBlock)).ok());
  }

  // What a model step does with the queued copies.
  void RunStep() {
    KvSwaps swaps = kv_->TakeSwaps();
    for (const KvSwap& s : swaps.out) ASSERT_TRUE(storage_->SwapOut(s.block, s.host).ok());
    for (const KvSwap& s : swaps.in) ASSERT_TRUE(storage_->SwapIn(s.block, s.host).ok());
    kv_->FinishSwaps(swaps, true, 1e-6, 1e-6);
  }

  // Runs a request over `tokens` (with `cache_salt`) to completion, writing a
  // recognisable pattern per position, and frees it (its full blocks stay cached).
  void Compute(int64_t id, const std::vector<int32_t>& tokens, std::string_view cache_salt = {}) {
    ComputedPrefix prefix = kv_->FindCachedPrefix(tokens, cache_salt);
    auto alloc = kv_->AllocateSlots(RequestId{id}, tokens, static_cast<int32_t>(tokens.size()) - prefix.num_tokens,
                                    &prefix);
    ASSERT_TRUE(alloc.ok()) << alloc.status();
    RunStep();
    for (int64_t slot : alloc->slot_mapping.slots) {
      for (int32_t layer = 0; layer < 2; ++layer) {
        auto bytes = storage_->BlockData(layer, BlockId{static_cast<int32_t>(slot / kBlock)});
        bytes[slot % kBlock] = std::byte{static_cast<uint8_t>(tokens[0] + layer)};
      }
    }
    ASSERT_TRUE(kv_->MarkComputed(RequestId{id}, tokens, static_cast<int32_t>(tokens.size()), cache_salt).ok());
    ASSERT_TRUE(kv_->Free(RequestId{id}).ok());
    ASSERT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
  }

  static std::vector<int32_t> Tokens(int32_t n, int32_t start) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
  }

  std::unique_ptr<KvStorage> storage_;
  std::unique_ptr<KvCacheManager> kv_;
};

TEST_F(KvTiersTest, EvictedBlocksAreOffloadedAndOnboardedByteForByte) {
  const std::vector<int32_t> a = Tokens(9, 100);  // 2 full blocks + 1 token
  Compute(1, a);
  // Remember A's first block's bytes as tier 0 held them.
  const ComputedPrefix cached = kv_->FindCachedPrefix(a);
  ASSERT_EQ(cached.blocks.size(), 2u);
  std::vector<std::byte> expected(storage_->SwapBytesPerBlock());
  ASSERT_TRUE(storage_->SwapOut(cached.blocks[0], expected.data()).ok());
  kv_->ReleasePrefix(cached);

  Compute(2, Tokens(16, 500));  // needs all 4 blocks: A's cached blocks are evicted
  EXPECT_EQ(kv_->tiers()->host().num_resident(), 2);
  EXPECT_EQ(kv_->tiers()->host().stats().blocks_offloaded, 2);
  // The events say where each block went: removed from tier 0, stored in the host tier.
  int removed_device = 0, stored_host = 0;
  for (const KvEvent& e : kv_->DrainEvents()) {
    removed_device += e.kind == KvEvent::Kind::kRemoved && e.tier == Tier::kDevice ? 1 : 0;
    stored_host += e.kind == KvEvent::Kind::kStored && e.tier == Tier::kHost ? 1 : 0;
  }
  EXPECT_EQ(removed_device, 2);
  EXPECT_EQ(stored_host, 2);

  ComputedPrefix again = kv_->FindCachedPrefix(a);
  EXPECT_TRUE(again.blocks.empty());
  ASSERT_EQ(again.host_slots.size(), 2u);
  EXPECT_EQ(again.num_tokens, 8);
  EXPECT_EQ(kv_->prefix_cache_stats().host_hit_tokens, 8);
  auto alloc = kv_->AllocateSlots(RequestId{3}, a, 1, &again);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  EXPECT_EQ(kv_->num_computed_tokens(RequestId{3}), 8);
  RunStep();
  std::vector<std::byte> onboarded(storage_->SwapBytesPerBlock());
  ASSERT_TRUE(storage_->SwapOut(kv_->block_table(RequestId{3})[0], onboarded.data()).ok());
  EXPECT_EQ(onboarded, expected);
  EXPECT_EQ(kv_->tiers()->host().num_pinned(), 0);
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

TEST_F(KvTiersTest, HostTierHitsNeedTheSameCacheSalt) {
  const std::vector<int32_t> a = Tokens(9, 100);  // 2 full blocks + 1 token
  Compute(1, a, "tenant-a");
  Compute(2, Tokens(16, 500));  // needs all 4 blocks: tenant A's go to the host tier
  ASSERT_EQ(kv_->tiers()->host().num_resident(), 2);
  for (const std::string_view other : {"tenant-b", ""}) {
    const ComputedPrefix miss = kv_->FindCachedPrefix(a, other);
    EXPECT_EQ(miss.num_tokens, 0) << "salt '" << other << "'";
    EXPECT_TRUE(miss.host_slots.empty()) << "salt '" << other << "'";
    kv_->ReleasePrefix(miss);
  }
  const ComputedPrefix hit = kv_->FindCachedPrefix(a, "tenant-a");
  EXPECT_EQ(hit.host_slots.size(), 2u);
  EXPECT_EQ(hit.num_tokens, 8);
  kv_->ReleasePrefix(hit);
  EXPECT_EQ(kv_->tiers()->host().num_pinned(), 0);
}

TEST_F(KvTiersTest, AnUnusedLookupGivesItsPinsBack) {
  Compute(1, Tokens(9, 100));
  Compute(2, Tokens(16, 500));
  ComputedPrefix prefix = kv_->FindCachedPrefix(Tokens(9, 100));
  ASSERT_EQ(prefix.host_slots.size(), 2u);
  EXPECT_EQ(kv_->tiers()->host().num_pinned(), 2);
  EXPECT_EQ(kv_->tiers()->num_lookup_pins(), 2);
  kv_->ReleasePrefix(prefix);
  EXPECT_EQ(kv_->tiers()->host().num_pinned(), 0);
  EXPECT_EQ(kv_->tiers()->num_lookup_pins(), 0);
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTiersTest, ACorruptedHostBlockIsAMissNotWrongKv) {
  Compute(1, Tokens(9, 100));
  Compute(2, Tokens(16, 500));
  const std::vector<BlockHash> hashes = HashFullBlocks(Tokens(9, 100), kBlock, /*salt=*/0);
  const std::optional<HostSlot> slot = kv_->tiers()->host().Find(hashes[0]);
  ASSERT_TRUE(slot.has_value());
  kv_->tiers()->host().data(*slot)[3] ^= std::byte{0x40};
  ComputedPrefix prefix = kv_->FindCachedPrefix(Tokens(9, 100));
  EXPECT_EQ(prefix.num_tokens, 0) << "the first block failed its checksum: nothing after it is used";
  EXPECT_EQ(kv_->tiers()->host().stats().checksum_failures, 1);
  kv_->ReleasePrefix(prefix);
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

TEST_F(KvTiersTest, ASwapInThatHashedCorruptBytesDropsTheSlotAndSaysSo) {
  kv_->tiers()->set_swap_ins_verified_by_copy(true);  // as under a runner that verifies
  Compute(1, Tokens(9, 100));
  Compute(2, Tokens(16, 500));
  const std::vector<BlockHash> hashes = HashFullBlocks(Tokens(9, 100), kBlock, /*salt=*/0);
  const std::optional<HostSlot> slot = kv_->tiers()->host().Peek(hashes[1]);
  ASSERT_TRUE(slot.has_value());
  kv_->tiers()->host().data(*slot)[3] ^= std::byte{0x40};
  ComputedPrefix prefix = kv_->FindCachedPrefix(Tokens(9, 100));
  ASSERT_EQ(prefix.host_slots.size(), 2u) << "the lookup leaves the verification to the copy";
  EXPECT_EQ(kv_->tiers()->host().stats().checksum_failures, 0);
  ASSERT_TRUE(kv_->AllocateSlots(RequestId{3}, Tokens(9, 100), 1, &prefix).ok());
  const KvSwaps swaps = kv_->TakeSwaps();
  ASSERT_EQ(swaps.in.size(), 2u);
  std::vector<uint64_t> read(2);
  std::vector<KvHostCopy> copies;
  for (const KvSwap& s : swaps.in) copies.push_back({s.block, s.host});
  ASSERT_TRUE(storage_->SwapIn(copies, read).ok());
  EXPECT_EQ(read[0], swaps.in[0].checksum);
  EXPECT_NE(read[1], swaps.in[1].checksum);
  EXPECT_EQ(kv_->FinishSwaps(swaps, true, 1e-6, 1e-6, {}, read), 1);
  EXPECT_EQ(kv_->tiers()->host().stats().checksum_failures, 1);
  EXPECT_FALSE(kv_->tiers()->host().Contains(hashes[1])) << "dropped: never found again";
  EXPECT_TRUE(kv_->tiers()->host().Contains(hashes[0]));
  EXPECT_EQ(kv_->tiers()->host().num_pinned(), 0);
  ASSERT_TRUE(kv_->Free(RequestId{3}).ok());
  EXPECT_TRUE(kv_->CheckInvariants().ok()) << kv_->CheckInvariants();
}

TEST_F(KvTiersTest, AttachNeedsPrefixCaching) {
  auto kv = KvCacheManager::Create({.num_blocks = 4, .block_size_tokens = kBlock, .enable_prefix_caching = false});
  ASSERT_TRUE(kv.ok());
  auto host = HostKvTier::Create({.capacity_bytes = 1024, .slot_bytes = 64});
  ASSERT_TRUE(host.ok());
  EXPECT_EQ((*kv)->AttachTiers(std::make_unique<KvTiers>(std::move(host).value(), nullptr, kBlock)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// KvTiers with a host and a disk tier and no pool: blocks enter the host tier as a
// step's swap-outs would (FinishSwaps), and the disk tier's queue is smaller than the
// bursts, as under a write-through-heavy workload.
class KvTiersDiskTest : public ::testing::Test {
 protected:
  static constexpr int32_t kLayers = 2;
  static constexpr int64_t kBlockBytes = 8192;
  static constexpr int64_t kSlotBytes = kLayers * kBlockBytes;
  static constexpr int32_t kQueueDepth = 4;  // writes may hold 2 of it

  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) / ("kvtiers-disk-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<KvTiers> MakeTiers(int32_t host_slots) {
    auto host = HostKvTier::Create({.capacity_bytes = host_slots * kSlotBytes, .slot_bytes = kSlotBytes});
    EXPECT_TRUE(host.ok()) << host.status();
    auto disk = DiskKvTier::Create({.directory = dir_, .capacity_bytes = 256 * DiskRecordBytes(kSlotBytes),
                                    .record_payload_bytes = kSlotBytes, .salt = 7, .num_layers = kLayers,
                                    .block_bytes = kBlockBytes, .dtype = 1, .queue_depth = kQueueDepth});
    EXPECT_TRUE(disk.ok()) << disk.status();
    return std::make_unique<KvTiers>(std::move(host).value(), std::move(disk).value(), kBlock);
  }

  static std::vector<BlockHash> Chain(int n) {
    std::vector<BlockHash> v;
    for (int i = 0; i < n; ++i) v.push_back(BlockHash{.low = 1000 + static_cast<uint64_t>(i), .high = 77});
    return v;
  }

  // Offloads `hashes` into the host tier in one step, as one burst of evictions.
  static void OffloadBurst(KvTiers& tiers, const std::vector<BlockHash>& hashes) {
    for (size_t i = 0; i < hashes.size(); ++i) {
      tiers.OnDeviceEvict(BlockId{static_cast<int32_t>(i)}, hashes[i], i == 0 ? kRootBlockHash : hashes[i - 1]);
    }
    KvSwaps swaps = tiers.TakeSwaps();
    ASSERT_EQ(swaps.out.size(), hashes.size());
    for (size_t i = 0; i < swaps.out.size(); ++i) {
      std::memset(swaps.out[i].host, static_cast<int>(i + 1), static_cast<size_t>(kSlotBytes));
    }
    tiers.FinishSwaps(swaps, /*copied=*/true, 1e-6, 1e-6);
  }

  std::string dir_;
};

TEST_F(KvTiersDiskTest, ABurstOfWriteThroughsLargerThanTheQueueAllReachTheDisk) {
  auto tiers = MakeTiers(64);
  const std::vector<BlockHash> hashes = Chain(20);
  OffloadBurst(*tiers, hashes);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
  tiers->DrainConnectors();
  EXPECT_EQ(tiers->disk()->num_records(), 20) << "a write-through refused by a full queue must wait, not vanish";
  for (const BlockHash& h : hashes) EXPECT_TRUE(tiers->disk()->Contains(h));
  EXPECT_EQ(tiers->stats().writes_skipped, 0);
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

TEST_F(KvTiersDiskTest, WritesInFlightNeverMakeADiskHitRecompute) {
  const std::vector<BlockHash> prefix = Chain(12);
  {
    auto writer = MakeTiers(64);
    OffloadBurst(*writer, prefix);
    writer->DrainConnectors();
    ASSERT_EQ(writer->disk()->num_records(), 12);
  }
  // A restarted worker: the prefix is on disk only. Another burst of offloads keeps
  // the disk's write queue full while a request finds the prefix and loads it.
  auto tiers = MakeTiers(64);
  ASSERT_EQ(tiers->disk()->num_records(), 12);
  std::vector<BlockHash> other;
  for (int i = 0; i < 16; ++i) other.push_back(BlockHash{.low = 5000 + static_cast<uint64_t>(i), .high = 9});
  OffloadBurst(*tiers, other);
  std::vector<HostSlot> host_slots;
  const int32_t on_disk = tiers->ExtendPrefix(prefix, 0, prefix.size(), &host_slots).num_blocks;
  EXPECT_TRUE(host_slots.empty());
  ASSERT_EQ(on_disk, 12);
  // Every block of the hit is loaded (12 reads, more than the whole queue of 4): the
  // ones that find no room wait for it.
  EXPECT_EQ(tiers->StartLoads(RequestId{1}, prefix, 0, static_cast<size_t>(on_disk)).num_blocks, 12);
  EXPECT_TRUE(tiers->AnyLoading(prefix));
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
  tiers->DrainConnectors();
  EXPECT_FALSE(tiers->AnyLoading(prefix));
  EXPECT_EQ(tiers->stats().reads_lost, 0);
  // Now all 12 are host hits, byte for byte what was offloaded.
  const int32_t still_on_disk = tiers->ExtendPrefix(prefix, 0, prefix.size(), &host_slots).num_blocks;
  EXPECT_EQ(still_on_disk, 0);
  ASSERT_EQ(host_slots.size(), 12u);
  for (size_t i = 0; i < host_slots.size(); ++i) {
    EXPECT_EQ(tiers->host().data(host_slots[i])[kSlotBytes - 1], std::byte{static_cast<uint8_t>(i + 1)}) << i;
  }
  tiers->Release(host_slots);
  tiers->ReleaseLoadHold(RequestId{1});
  tiers->DrainConnectors();
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

// Offloads `hashes` one step at a time, as a busy worker's evictions would: those the
// host tier has no unpinned slot for are skipped.
void OffloadSteps(KvTiers& tiers, const std::vector<BlockHash>& hashes) {
  for (size_t i = 0; i < hashes.size(); ++i) {
    tiers.OnDeviceEvict(BlockId{0}, hashes[i], i == 0 ? kRootBlockHash : hashes[i - 1]);
    tiers.FinishSwaps(tiers.TakeSwaps(), /*copied=*/true, 1e-6, 1e-6);
    tiers.Poll();
  }
}

// The multi-turn benchmark's loss: a waiting request's disk load landed in the host
// tier, and the offloads of the running requests' evictions evicted it (and the host
// hits before it) before the request was admitted, so it recomputed what it had read.
TEST_F(KvTiersDiskTest, ADiskLoadAndTheHostHitsBeforeItStayUntilTheOwnerReleasesThem) {
  const std::vector<BlockHash> prefix = Chain(12);
  {
    auto writer = MakeTiers(64);
    OffloadBurst(*writer, prefix);
    writer->DrainConnectors();
    ASSERT_EQ(writer->disk()->num_records(), 12);
  }
  // A restarted worker with a 32-slot host tier (load holds may take 16): the first 4
  // blocks come back into it (tier 0 offloads them again), the other 8 are on disk only.
  auto tiers = MakeTiers(32);
  OffloadBurst(*tiers, std::vector<BlockHash>(prefix.begin(), prefix.begin() + 4));
  tiers->DrainConnectors();
  std::vector<HostSlot> host_slots;
  const int32_t on_disk = tiers->ExtendPrefix(prefix, 0, prefix.size(), &host_slots).num_blocks;
  ASSERT_EQ(host_slots.size(), 4u);
  ASSERT_EQ(on_disk, 8);
  const RequestId owner{7};
  EXPECT_EQ(tiers->StartLoads(owner, prefix, 4, static_cast<size_t>(on_disk), host_slots).num_blocks, 8);
  tiers->Release(host_slots);  // the request waits for the load holding no lookup
  host_slots.clear();
  tiers->DrainConnectors();
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();

  // Running requests evict 20 other blocks meanwhile: all the host tier has besides the hold.
  std::vector<BlockHash> other;
  for (int i = 0; i < 20; ++i) other.push_back(BlockHash{.low = 5000 + static_cast<uint64_t>(i), .high = 9});
  OffloadSteps(*tiers, other);
  tiers->DrainConnectors();
  EXPECT_EQ(tiers->stats().offload_skipped, 0) << "the hold is within its share: the rest is the offloads'";
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();

  // Admission: the whole prefix is in the host tier, byte for byte what was offloaded.
  EXPECT_EQ(tiers->ExtendPrefix(prefix, 0, prefix.size(), &host_slots).num_blocks, 0);
  ASSERT_EQ(host_slots.size(), 12u) << "the load (or the hits before it) was evicted before the owner came back";
  for (size_t i = 0; i < host_slots.size(); ++i) {
    EXPECT_EQ(tiers->host().data(host_slots[i])[kSlotBytes - 1], std::byte{static_cast<uint8_t>(i + 1)}) << i;
  }
  ASSERT_EQ(tiers->load_holds().size(), 1u);
  EXPECT_EQ(tiers->load_holds()[0].first, owner);
  EXPECT_EQ(tiers->load_holds()[0].second, 12);
  tiers->ReleaseLoadHold(owner);
  EXPECT_TRUE(tiers->load_holds().empty());
  EXPECT_EQ(tiers->host().num_pinned(), 12) << "only the lookup's pins remain";
  tiers->Release(host_slots);
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

TEST_F(KvTiersDiskTest, AReleasedOwnersReadsLandUnheld) {
  const std::vector<BlockHash> prefix = Chain(6);
  {
    auto writer = MakeTiers(64);
    OffloadBurst(*writer, prefix);
    writer->DrainConnectors();
  }
  auto tiers = MakeTiers(16);
  std::vector<HostSlot> host_slots;
  ASSERT_EQ(tiers->ExtendPrefix(prefix, 0, prefix.size(), &host_slots).num_blocks, 6);
  EXPECT_EQ(tiers->StartLoads(RequestId{3}, prefix, 0, 6).num_blocks, 6);
  tiers->ReleaseLoadHold(RequestId{3});  // the request ended while its load ran
  tiers->DrainConnectors();
  EXPECT_TRUE(tiers->load_holds().empty());
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_EQ(tiers->host().num_resident(), 6) << "the blocks still land, as a plain cache";
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

// Chains of `n` blocks with distinct hashes (`tag` tells them apart).
std::vector<BlockHash> ChainOf(int n, uint64_t tag) {
  std::vector<BlockHash> v;
  for (int i = 0; i < n; ++i) v.push_back(BlockHash{.low = tag * 1000 + static_cast<uint64_t>(i), .high = tag});
  return v;
}

class KvTiersLoadHoldTest : public KvTiersDiskTest {
 protected:
  void WriteChains(const std::vector<std::vector<BlockHash>>& chains) {
    auto writer = MakeTiers(64);
    for (const auto& chain : chains) OffloadBurst(*writer, chain);
    writer->DrainConnectors();
  }
  // The lookup of `chain` on `tiers`: its host hits (pinned; appended to `hits`) and how
  // many disk blocks follow them.
  static int32_t Lookup(KvTiers& tiers, const std::vector<BlockHash>& chain, std::vector<HostSlot>* hits) {
    return tiers.ExtendPrefix(chain, 0, chain.size(), hits).num_blocks;
  }
};

// The multi-turn benchmark's second loss: the holds of a few waiting requests filled the
// host tier, so the running requests' evictions were not offloaded (lost for good) and
// later loads were cut short. Holds now take at most their share; a load that does not
// fit in what other owners leave waits, holding nothing.
TEST_F(KvTiersLoadHoldTest, HoldsStayWithinTheirShareAndLeaveTheRestToOffloads) {
  const std::vector<BlockHash> a = ChainOf(6, 1), b = ChainOf(6, 2);
  WriteChains({a, b});
  auto tiers = MakeTiers(16);
  ASSERT_EQ(tiers->max_held_slots(), 8);
  std::vector<HostSlot> hits;
  ASSERT_EQ(Lookup(*tiers, a, &hits), 6);
  EXPECT_EQ(tiers->StartLoads(RequestId{1}, a, 0, 6).num_blocks, 6);
  EXPECT_EQ(tiers->held_slots(), 6);

  ASSERT_EQ(Lookup(*tiers, b, &hits), 6);
  const KvLoadStart second = tiers->StartLoads(RequestId{2}, b, 0, 6);
  EXPECT_TRUE(second.deferred) << "6 more would take the holds past their 8 slots";
  EXPECT_EQ(second.num_blocks, 0);
  EXPECT_FALSE(tiers->has_load_hold(RequestId{2})) << "a deferred load holds nothing";
  EXPECT_EQ(tiers->held_slots(), 6);
  EXPECT_EQ(tiers->stats().loads_deferred, 1);
  EXPECT_EQ(tiers->stats().load_blocks_cut, 0);
  EXPECT_FALSE(tiers->AnyLoading(b));
  tiers->DrainConnectors();
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();

  // Running requests evict 10 blocks: the host tier's 16 slots minus the 6 held.
  std::vector<BlockHash> other = ChainOf(10, 3);
  OffloadSteps(*tiers, other);
  tiers->DrainConnectors();
  EXPECT_EQ(tiers->stats().offload_skipped, 0);
  EXPECT_EQ(tiers->host().num_resident(), 16);
  ASSERT_EQ(Lookup(*tiers, a, &hits), 0);
  ASSERT_EQ(hits.size(), 6u) << "the hold kept every block it read";
  tiers->Release(hits);
  hits.clear();

  // Owner 1 is admitted: its hold goes, and owner 2's retry fits.
  tiers->ReleaseLoadHold(RequestId{1});
  EXPECT_EQ(tiers->held_slots(), 0);
  ASSERT_EQ(Lookup(*tiers, b, &hits), 6);
  EXPECT_EQ(tiers->StartLoads(RequestId{2}, b, 0, 6).num_blocks, 6);
  tiers->DrainConnectors();
  ASSERT_EQ(Lookup(*tiers, b, &hits), 0);
  EXPECT_EQ(hits.size(), 6u);
  tiers->Release(hits);
  tiers->ReleaseLoadHold(RequestId{2});
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

// Holds always drain: an owner that holds already is never deferred (its admission is
// what frees room), it loads what fits and the rest is recomputed.
TEST_F(KvTiersLoadHoldTest, AnOwnerThatHoldsIsNeverDeferred) {
  const std::vector<BlockHash> a = ChainOf(6, 1), b = ChainOf(3, 2);
  WriteChains({a, b});
  auto tiers = MakeTiers(16);  // holds may take 8
  std::vector<HostSlot> hits;
  ASSERT_EQ(Lookup(*tiers, a, &hits), 6);
  EXPECT_EQ(tiers->StartLoads(RequestId{1}, a, 0, 4).num_blocks, 4);  // a load cut at 4, say
  ASSERT_EQ(Lookup(*tiers, b, &hits), 3);
  EXPECT_EQ(tiers->StartLoads(RequestId{2}, b, 0, 3).num_blocks, 3);
  EXPECT_EQ(tiers->held_slots(), 7);
  tiers->DrainConnectors();

  // Owner 1 comes back: its first 4 blocks are host hits (held already), 2 more on disk.
  ASSERT_EQ(Lookup(*tiers, a, &hits), 2);
  ASSERT_EQ(hits.size(), 4u);
  const KvLoadStart more = tiers->StartLoads(RequestId{1}, a, 4, 2, hits);
  EXPECT_FALSE(more.deferred);
  EXPECT_EQ(more.num_blocks, 1) << "one slot of the share is left; its own hits are not counted twice";
  EXPECT_EQ(tiers->held_slots(), 8);
  EXPECT_EQ(tiers->stats().load_blocks_cut, 1);
  tiers->Release(hits);
  hits.clear();
  tiers->DrainConnectors();
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
  ASSERT_EQ(tiers->load_holds().size(), 2u);
  tiers->ReleaseLoadHold(RequestId{1});
  tiers->ReleaseLoadHold(RequestId{2});
  EXPECT_EQ(tiers->held_slots(), 0);
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

// With nobody else holding, waiting cannot help: a load larger than the share loads
// what fits at once.
TEST_F(KvTiersLoadHoldTest, ALoneLoadLargerThanTheShareLoadsWhatFits) {
  const std::vector<BlockHash> a = ChainOf(12, 1);
  WriteChains({a});
  auto tiers = MakeTiers(16);
  std::vector<HostSlot> hits;
  ASSERT_EQ(Lookup(*tiers, a, &hits), 12);
  const KvLoadStart load = tiers->StartLoads(RequestId{1}, a, 0, 12);
  EXPECT_FALSE(load.deferred);
  EXPECT_EQ(load.num_blocks, 8);
  EXPECT_EQ(tiers->stats().load_blocks_cut, 4);
  tiers->DrainConnectors();
  EXPECT_EQ(Lookup(*tiers, a, &hits), 4);
  EXPECT_EQ(hits.size(), 8u);
  tiers->Release(hits);
  tiers->ReleaseLoadHold(RequestId{1});
  EXPECT_EQ(tiers->host().num_pinned(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

// Failed reads give their reservation back: the share is not leaked.
TEST_F(KvTiersLoadHoldTest, AReadThatFailsGivesItsReservationBack) {
  const std::vector<BlockHash> a = ChainOf(4, 1);
  WriteChains({a});
  // Corrupt the third block's payload on disk: its read fails its checksum.
  {
    auto reader = MakeTiers(16);
    const std::optional<DiskRecordLocation> where = reader->disk()->LocationOf(a[2]);
    ASSERT_TRUE(where.has_value());
    reader.reset();
    FILE* f = std::fopen(where->path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, where->offset + kDiskRecordAlignment + 100, SEEK_SET), 0);
    const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ASSERT_EQ(std::fwrite(junk, 1, sizeof(junk), f), sizeof(junk));
    std::fclose(f);
  }
  auto tiers = MakeTiers(16);
  std::vector<HostSlot> hits;
  ASSERT_EQ(Lookup(*tiers, a, &hits), 4);
  EXPECT_EQ(tiers->StartLoads(RequestId{1}, a, 0, 4).num_blocks, 4);
  EXPECT_EQ(tiers->held_slots(), 4);
  tiers->DrainConnectors();
  EXPECT_EQ(tiers->held_slots(), 3) << "the failed read's slot is no longer counted";
  ASSERT_EQ(tiers->load_holds().size(), 1u);
  EXPECT_EQ(tiers->load_holds()[0].second, 3);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
  tiers->ReleaseLoadHold(RequestId{1});
  EXPECT_EQ(tiers->held_slots(), 0);
  EXPECT_TRUE(tiers->CheckInvariants().ok()) << tiers->CheckInvariants();
}

}  // namespace
}  // namespace kvmesh::kv
