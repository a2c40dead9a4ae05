#include "cluster/store_residency.h"

#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/block_hash.h"
#include "kv_store/store_key.h"

namespace kvmesh::cluster {
namespace {

constexpr kv::SharedKeySpace kRank0{.low = 11, .high = 12};
constexpr kv::SharedKeySpace kRank1{.low = 21, .high = 22};

std::vector<kv::BlockHash> Hashes(int32_t num_blocks) {
  std::vector<int32_t> tokens(static_cast<size_t>(num_blocks) * 4);
  std::iota(tokens.begin(), tokens.end(), 1);
  return kv::HashFullBlocks(tokens, 4, 0);
}

// A page storing blocks [first, last) of `hashes` under `space`.
kv_store::StoreEventsPage Stored(uint64_t epoch, const kv::SharedKeySpace& space,
                                 const std::vector<kv::BlockHash>& hashes, size_t first, size_t last,
                                 bool reset = false) {
  kv_store::StoreEventsPage page{.epoch = epoch, .reset = reset};
  const kv_store::StoreKeySpace keys = kv_store::StoreKeySpace::FromId(space);
  for (size_t i = first; i < last; ++i) page.events.push_back({.key = keys.Key(hashes[i])});
  return page;
}

TEST(StoreResidencyTest, CountsTheLeadingRunAStoreHoldsUnderTheKeySpace) {
  StoreResidency residency;
  const auto hashes = Hashes(8);
  EXPECT_TRUE(residency.Apply("s1:1", Stored(5, kRank0, hashes, 0, 5)));  // first contact: a reset
  const std::vector<kv::SharedKeySpace> rank0{kRank0};
  EXPECT_EQ(residency.LeadingRun(rank0, hashes, 0), 5);
  EXPECT_EQ(residency.LeadingRun(rank0, hashes, 3), 2) << "from the worker's own run on";
  EXPECT_EQ(residency.LeadingRun(std::vector<kv::SharedKeySpace>{kRank1}, hashes, 0), 0)
      << "another key space (model, layout, rank) names other keys";
  EXPECT_EQ(residency.LeadingRun({}, hashes, 0), 0) << "a worker without a kv-store loads nothing from one";
  EXPECT_EQ(residency.num_blocks("s1:1"), 5);
  EXPECT_EQ(residency.epoch("s1:1"), 5u);
}

TEST(StoreResidencyTest, EveryRankMustHoldABlockForItToCount) {
  StoreResidency residency;
  const auto hashes = Hashes(6);
  residency.Apply("s1:1", Stored(5, kRank0, hashes, 0, 6));
  residency.Apply("s2:1", Stored(9, kRank1, hashes, 0, 3));  // rank 1's shares on another store
  const std::vector<kv::SharedKeySpace> both{kRank0, kRank1};
  EXPECT_EQ(residency.LeadingRun(both, hashes, 0), 3);
}

TEST(StoreResidencyTest, RemovalsAndASecondHolderAreCounted) {
  StoreResidency residency;
  const auto hashes = Hashes(4);
  residency.Apply("s1:1", Stored(5, kRank0, hashes, 0, 4));
  residency.Apply("s2:1", Stored(6, kRank0, hashes, 1, 2));  // block 1 is on both (a ring change)
  kv_store::StoreEventsPage removal{.epoch = 5};
  removal.events.push_back({.key = kv_store::StoreKeySpace::FromId(kRank0).Key(hashes[1]), .removed = true});
  EXPECT_FALSE(residency.Apply("s1:1", removal));
  const std::vector<kv::SharedKeySpace> rank0{kRank0};
  EXPECT_EQ(residency.LeadingRun(rank0, hashes, 0), 4) << "s2 still holds block 1";
  residency.Forget("s2:1");
  EXPECT_EQ(residency.LeadingRun(rank0, hashes, 0), 1);
  EXPECT_EQ(residency.num_keys(), 3);
}

// The store restarted: whatever its previous life held is gone, even if the page
// itself does not say reset (a test that fails when epochs are ignored).
TEST(StoreResidencyTest, APageOfAnotherEpochReplacesWhatWasKnownOfTheStore) {
  StoreResidency residency;
  const auto hashes = Hashes(6);
  residency.Apply("s1:1", Stored(5, kRank0, hashes, 0, 6));
  EXPECT_TRUE(residency.Apply("s1:1", Stored(8, kRank0, hashes, 0, 1)));
  const std::vector<kv::SharedKeySpace> rank0{kRank0};
  EXPECT_EQ(residency.LeadingRun(rank0, hashes, 0), 1);
  EXPECT_EQ(residency.num_blocks("s1:1"), 1);
  EXPECT_EQ(residency.epoch("s1:1"), 8u);
  // ... and an explicit reset of the same epoch (the mirror fell behind) does the same.
  EXPECT_TRUE(residency.Apply("s1:1", kv_store::StoreEventsPage{.epoch = 8, .reset = true}));
  EXPECT_EQ(residency.num_keys(), 0);
}

TEST(StoreResidencyTest, TheMatcherAgreesWithLeadingRunForEveryWorker) {
  StoreResidency residency;
  const auto hashes = Hashes(10);
  residency.Apply("s1:1", Stored(5, kRank0, hashes, 0, 7));
  residency.Apply("s1:1", Stored(5, kRank1, hashes, 0, 4));
  StoreResidency::Matcher matcher(residency, hashes);
  const std::vector<std::vector<kv::SharedKeySpace>> workers{{kRank0}, {kRank1}, {kRank0, kRank1}, {}};
  for (const auto& spaces : workers) {
    for (size_t first : {0u, 2u, 6u, 10u}) {
      EXPECT_EQ(matcher.LeadingRun(spaces, first), residency.LeadingRun(spaces, hashes, first));
    }
  }
}

}  // namespace
}  // namespace kvmesh::cluster
