#include "backend/cpu/weight_arena.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/huge_pages.h"

namespace kvmesh::backend::cpu {
namespace {

TEST(WeightArenaTest, BlocksArePageAlignedDisjointAndShareHugePageChunks) {
  WeightArena arena;
  std::vector<WeightArena::Block> blocks;
  // SmolLM2-135M's linear sizes (bf16, packed): several per 32 MiB chunk.
  for (const int64_t bytes : {1105920, 663552, 3538944, 1769472, 1105920, 1}) {
    WeightArena::Block b = arena.Allocate(bytes);
    ASSERT_TRUE(b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % WeightArena::kAlignment, 0u);
    std::memset(b.data(), static_cast<int>(blocks.size()) + 1, static_cast<size_t>(bytes));
    blocks.push_back(b);
  }
  // The first block starts a chunk: huge-page aligned; the next ones follow it.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[0].data()) % kHugePageBytes, 0u);
  EXPECT_EQ(blocks[1].data(), blocks[0].data() + 1105920);  // 1105920 is a multiple of 4096
  // Every block kept its own bytes (no overlap).
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(static_cast<int>(blocks[i].data()[0]), static_cast<int>(i) + 1);
}

TEST(WeightArenaTest, ALargeBlockGetsItsOwnChunkAndBlocksOutliveTheArena) {
  WeightArena::Block small, large;
  {
    WeightArena arena;
    small = arena.Allocate(4096);
    large = arena.Allocate(WeightArena::kChunkBytes);  // above half a chunk
    ASSERT_TRUE(small);
    ASSERT_TRUE(large);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u);
    const WeightArena::Block next = arena.Allocate(4096);
    EXPECT_EQ(next.data(), small.data() + 4096) << "the large block did not take the shared chunk's room";
  }
  // The arena is gone; its blocks still own their chunks.
  std::memset(small.data(), 1, 4096);
  std::memset(large.data(), 2, static_cast<size_t>(WeightArena::kChunkBytes));
  EXPECT_EQ(static_cast<int>(large.data()[WeightArena::kChunkBytes - 1]), 2);
}

TEST(WeightArenaTest, NoBytesIsAnEmptyBlock) {
  WeightArena arena;
  EXPECT_FALSE(arena.Allocate(0));
}

}  // namespace
}  // namespace kvmesh::backend::cpu
