#include "kv/transport/kv_runs.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvmesh::kv {
namespace {

std::vector<BlockId> Ids(std::initializer_list<int32_t> v) {
  std::vector<BlockId> out;
  for (int32_t x : v) out.push_back(BlockId{x});
  return out;
}

TEST(KvRunsTest, MergesBlocksContiguousOnBothSidesIntoOneRun) {
  const auto src = Ids({10, 11, 12, 13});
  const auto dst = Ids({4, 5, 6, 7});
  const auto runs = MergeKvRuns(src, dst);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (KvRun{.first_index = 0, .src_first = BlockId{10}, .dst_first = BlockId{4}, .num_blocks = 4}));
}

TEST(KvRunsTest, SplitsWhereEitherSideJumps) {
  // [10,11]->[6,7]; 20->8 breaks on the source side; 21->30 on the destination side.
  const auto src = Ids({10, 11, 20, 21, 22});
  const auto dst = Ids({6, 7, 8, 30, 31});
  const auto runs = MergeKvRuns(src, dst);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].num_blocks, 2);
  EXPECT_EQ(runs[1], (KvRun{.first_index = 2, .src_first = BlockId{20}, .dst_first = BlockId{8}, .num_blocks = 1}));
  EXPECT_EQ(runs[2], (KvRun{.first_index = 3, .src_first = BlockId{21}, .dst_first = BlockId{30}, .num_blocks = 2}));
}

TEST(KvRunsTest, EmptyInputHasNoRuns) { EXPECT_TRUE(MergeKvRuns({}, {}).empty()); }

}  // namespace
}  // namespace kvmesh::kv
