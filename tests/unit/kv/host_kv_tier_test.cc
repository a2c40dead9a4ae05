#include "kv/host_kv_tier.h"

#include <cstring>

#include <gtest/gtest.h>

#include "kv/checksum.h"

namespace kvmesh::kv {
namespace {

BlockHash H(uint64_t v) { return BlockHash{.low = v, .high = ~v}; }

std::unique_ptr<HostKvTier> MakeTier(int32_t slots, int64_t slot_bytes = 64) {
  auto tier = HostKvTier::Create({.capacity_bytes = slots * slot_bytes, .slot_bytes = slot_bytes});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return std::move(tier).value();
}

HostSlot Store(HostKvTier& tier, uint64_t v, std::byte fill) {
  auto slot = tier.BeginStore(H(v), H(v - 1));
  EXPECT_TRUE(slot.ok()) << slot.status();
  std::memset(tier.data(*slot).data(), static_cast<int>(fill), tier.data(*slot).size());
  tier.CommitStore(*slot);
  return *slot;
}

TEST(HostKvTierTest, RefusesCapacityBelowOneBlockNamingTheFlag) {
  auto tier = HostKvTier::Create({.capacity_bytes = 10, .slot_bytes = 64});
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--kv-host-cache-bytes"), std::string::npos);
}

TEST(HostKvTierTest, FillingSlotIsNotFoundUntilCommitted) {
  auto tier = MakeTier(4);
  auto slot = tier->BeginStore(H(1), kRootBlockHash);
  ASSERT_TRUE(slot.ok());
  EXPECT_FALSE(tier->Find(H(1)).has_value());
  EXPECT_TRUE(tier->Contains(H(1)));
  EXPECT_EQ(tier->BeginStore(H(1), kRootBlockHash).status().code(), absl::StatusCode::kAlreadyExists);
  tier->CommitStore(*slot);
  EXPECT_EQ(tier->Find(H(1)), *slot);
  EXPECT_TRUE(tier->CheckInvariants().ok());
  const std::vector<KvEvent> events = tier->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[0].tier, Tier::kHost);
}

TEST(HostKvTierTest, CommitStoreKeepsTheWritersChecksumAndVerifyChecksItAgainstTheBytes) {
  auto tier = MakeTier(2);
  auto good = tier->BeginStore(H(1), kRootBlockHash);
  ASSERT_TRUE(good.ok());
  std::memset(tier->data(*good).data(), 7, tier->data(*good).size());
  const uint64_t sum = Checksum(tier->data(*good));
  tier->CommitStore(*good, sum);
  EXPECT_EQ(tier->checksum(*good), sum);
  EXPECT_TRUE(tier->Verify(*good).ok());
  // A writer whose checksum does not match what landed: the block never goes back up.
  auto bad = tier->BeginStore(H(2), H(1));
  ASSERT_TRUE(bad.ok());
  std::memset(tier->data(*bad).data(), 8, tier->data(*bad).size());
  tier->CommitStore(*bad, sum);
  EXPECT_EQ(tier->Verify(*bad).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().checksum_failures, 1);
  EXPECT_FALSE(tier->Find(H(2)).has_value());
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST(HostKvTierTest, EvictsLeastRecentlyUsedUnpinnedSlot) {
  auto tier = MakeTier(3);
  Store(*tier, 10, std::byte{1});
  const HostSlot b = Store(*tier, 11, std::byte{2});
  Store(*tier, 12, std::byte{3});
  ASSERT_TRUE(tier->Find(H(10)).has_value());  // 10 is now most recent: 11 is the LRU
  tier->Pin(b);                                // ... but pinned: 12 goes instead
  Store(*tier, 13, std::byte{4});
  EXPECT_TRUE(tier->Find(H(10)).has_value());
  EXPECT_TRUE(tier->Find(H(11)).has_value());
  EXPECT_FALSE(tier->Find(H(12)).has_value());
  EXPECT_EQ(tier->stats().evictions, 1);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST(HostKvTierTest, BeginStoreFailsWhenEverySlotIsPinnedOrFilling) {
  auto tier = MakeTier(2);
  const HostSlot a = Store(*tier, 1, std::byte{1});
  tier->Pin(a);
  ASSERT_TRUE(tier->BeginStore(H(2), kRootBlockHash).ok());  // filling
  EXPECT_EQ(tier->BeginStore(H(3), kRootBlockHash).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->stats().write_failures, 1);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST(HostKvTierTest, VerifyCatchesAFlippedByteAndDropsTheBlock) {
  auto tier = MakeTier(2);
  const HostSlot a = Store(*tier, 7, std::byte{9});
  EXPECT_TRUE(tier->Verify(a).ok());
  tier->data(a)[5] ^= std::byte{1};
  EXPECT_EQ(tier->Verify(a).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().checksum_failures, 1);
  EXPECT_FALSE(tier->Find(H(7)).has_value());
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST(HostKvTierTest, AbortStoreFreesTheSlot) {
  auto tier = MakeTier(1);
  auto slot = tier->BeginStore(H(1), kRootBlockHash);
  ASSERT_TRUE(slot.ok());
  tier->AbortStore(*slot);
  EXPECT_FALSE(tier->Contains(H(1)));
  EXPECT_TRUE(tier->BeginStore(H(2), kRootBlockHash).ok());
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST(HostKvTierTest, UsesTheGivenAllocator) {
  int allocations = 0, frees = 0;
  std::vector<std::byte> arena(256);
  {
    auto tier = HostKvTier::Create({.capacity_bytes = 256,
                                    .slot_bytes = 64,
                                    .allocate = [&](int64_t) { ++allocations; return arena.data(); },
                                    .deallocate = [&](std::byte*) { ++frees; }});
    ASSERT_TRUE(tier.ok());
    EXPECT_EQ((*tier)->num_slots(), 4);
    EXPECT_EQ((*tier)->data(HostSlot{1}).data(), arena.data() + 64);
  }
  EXPECT_EQ(allocations, 1);
  EXPECT_EQ(frees, 1);
}

}  // namespace
}  // namespace kvmesh::kv
