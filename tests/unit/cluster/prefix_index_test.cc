#include "cluster/prefix_index.h"

#include <vector>

#include <gtest/gtest.h>

#include "kv/block_hash.h"

namespace kvmesh::cluster {
namespace {

using kv::BlockHash;
using kv::KvEvent;
using kv::Tier;

std::vector<BlockHash> Hashes(int n, int32_t first_token = 0) {
  std::vector<int32_t> tokens(static_cast<size_t>(n) * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + static_cast<int32_t>(i);
  return kv::HashFullBlocks(tokens, 4, /*salt=*/0);
}

std::vector<KvEvent> Stored(const std::vector<BlockHash>& hashes, Tier tier = Tier::kDevice) {
  std::vector<KvEvent> events;
  for (size_t i = 0; i < hashes.size(); ++i) {
    events.push_back(KvEvent{.kind = KvEvent::Kind::kStored,
                             .block_hash = hashes[i],
                             .parent_hash = i == 0 ? kv::kRootBlockHash : hashes[i - 1],
                             .tier = tier,
                             .num_tokens = 4});
  }
  return events;
}

KvEvent Removed(const BlockHash& hash, Tier tier = Tier::kDevice) {
  return KvEvent{.kind = KvEvent::Kind::kRemoved, .block_hash = hash, .tier = tier, .num_tokens = 4};
}

TEST(GlobalPrefixIndexTest, MatchCountsLeadingBlocksPerWorker) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(6);
  index.Apply("a", Stored({prompt.begin(), prompt.begin() + 4}));
  index.Apply("b", Stored({prompt.begin(), prompt.begin() + 2}));
  const auto matches = index.Match(prompt);
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches.at("a").num_blocks, 4);
  EXPECT_EQ(matches.at("b").num_blocks, 2);
  EXPECT_EQ(index.MatchWorker(prompt, "a").num_blocks, 4);
  EXPECT_EQ(index.MatchWorker(prompt, "nobody").num_blocks, 0);
  EXPECT_EQ(index.num_blocks("a"), 4);
  EXPECT_EQ(index.num_hashes(), 4);
}

TEST(GlobalPrefixIndexTest, MatchStopsAtTheFirstMissingBlock) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(5);
  index.Apply("a", Stored(prompt));
  index.Apply("a", std::vector<KvEvent>{Removed(prompt[2])});
  EXPECT_EQ(index.MatchWorker(prompt, "a").num_blocks, 2);
  EXPECT_EQ(index.Match(prompt).at("a").num_blocks, 2);
  // Holding later blocks without the first gives nothing.
  index.Apply("b", Stored({prompt.begin() + 1, prompt.end()}));
  EXPECT_FALSE(index.Match(prompt).contains("b"));
}

TEST(GlobalPrefixIndexTest, RemovalsDropHashesAndAreIdempotent) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(3);
  index.Apply("a", Stored(prompt));
  index.Apply("b", Stored(prompt));
  std::vector<KvEvent> removals;
  for (const auto& h : prompt) removals.push_back(Removed(h));
  index.Apply("a", removals);
  index.Apply("a", removals);  // again: no effect
  EXPECT_EQ(index.num_blocks("a"), 0);
  EXPECT_EQ(index.num_hashes(), 3);  // b still holds them
  EXPECT_FALSE(index.Match(prompt).contains("a"));
  index.Apply("b", removals);
  EXPECT_EQ(index.num_hashes(), 0);
  EXPECT_TRUE(index.Match(prompt).empty());
}

TEST(GlobalPrefixIndexTest, WorkerBlocksRebuildTheSameMatchesInAnotherIndex) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(5);
  index.Apply("w1", Stored(prompt));
  index.Apply("w1", Stored({prompt[0], prompt[1]}, Tier::kHost));
  index.Apply("w2", Stored(Hashes(3, 1000)));
  const std::vector<KvEvent> blocks = index.WorkerBlocks("w1", /*max_blocks=*/100);
  EXPECT_EQ(blocks.size(), 7u);  // 5 on device, 2 of them on host too
  GlobalPrefixIndex copy;
  copy.Apply("w1", blocks);
  EXPECT_EQ(copy.MatchWorker(prompt, "w1"), index.MatchWorker(prompt, "w1"));
  EXPECT_EQ(copy.num_blocks("w1"), 5);
  EXPECT_EQ(index.WorkerBlocks("w1", 2).size(), 2u);  // bounded, tiers included
  EXPECT_TRUE(index.WorkerBlocks("nobody", 10).empty());
  EXPECT_TRUE(index.WorkerBlocks("w1", 0).empty());
}

TEST(GlobalPrefixIndexTest, StoredTwiceCountsOnce) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(2);
  index.Apply("a", Stored(prompt));
  index.Apply("a", Stored(prompt));
  EXPECT_EQ(index.num_blocks("a"), 2);
  index.Apply("a", std::vector<KvEvent>{Removed(prompt[0])});
  EXPECT_EQ(index.MatchWorker(prompt, "a").num_blocks, 0);
}

TEST(GlobalPrefixIndexTest, TracksTiersSeparatelyAndMatchesAtTheBestTier) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(3);
  index.Apply("a", Stored(prompt, Tier::kDevice));
  // Offload of block 0 and 1: written to host, then evicted from device.
  index.Apply("a", Stored({prompt[0], prompt[1]}, Tier::kHost));
  index.Apply("a", std::vector<KvEvent>{Removed(prompt[0], Tier::kDevice)});
  EXPECT_TRUE(index.Contains("a", prompt[0], Tier::kHost));
  EXPECT_FALSE(index.Contains("a", prompt[0], Tier::kDevice));
  EXPECT_TRUE(index.Contains("a", prompt[1], Tier::kDevice));
  const PrefixMatch match = index.MatchWorker(prompt, "a");
  EXPECT_EQ(match.num_blocks, 3);
  EXPECT_EQ(match.num_blocks_by_tier[static_cast<int>(Tier::kDevice)], 2);
  EXPECT_EQ(match.num_blocks_by_tier[static_cast<int>(Tier::kHost)], 1);
  EXPECT_EQ(index.Match(prompt).at("a"), match);
  // Dropping the host copy too makes the block absent.
  index.Apply("a", std::vector<KvEvent>{Removed(prompt[0], Tier::kHost)});
  EXPECT_EQ(index.MatchWorker(prompt, "a").num_blocks, 0);
  EXPECT_EQ(index.num_blocks("a"), 2);
}

TEST(GlobalPrefixIndexTest, RemoveWorkerForgetsOnlyThatWorker) {
  GlobalPrefixIndex index;
  const auto prompt = Hashes(4);
  index.Apply("a", Stored(prompt));
  index.Apply("b", Stored({prompt[0]}));
  index.RemoveWorker("a");
  EXPECT_EQ(index.num_workers(), 1);
  EXPECT_EQ(index.num_blocks("a"), 0);
  EXPECT_EQ(index.num_hashes(), 1);
  const auto matches = index.Match(prompt);
  ASSERT_EQ(matches.size(), 1u);
  EXPECT_EQ(matches.at("b").num_blocks, 1);
  // The slot is reused by a new worker without inheriting anything.
  index.Apply("c", Stored({prompt[0], prompt[1]}));
  EXPECT_EQ(index.Match(prompt).at("c").num_blocks, 2);
  EXPECT_EQ(index.Match(prompt).at("b").num_blocks, 1);
}

TEST(GlobalPrefixIndexTest, DifferentPromptsDoNotMatch) {
  GlobalPrefixIndex index;
  index.Apply("a", Stored(Hashes(4, /*first_token=*/0)));
  EXPECT_TRUE(index.Match(Hashes(4, /*first_token=*/1000)).empty());
  EXPECT_TRUE(index.Match({}).empty());
}

}  // namespace
}  // namespace kvmesh::cluster
