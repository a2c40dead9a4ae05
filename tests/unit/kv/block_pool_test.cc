#include "kv/block_pool.h"

#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

BlockHash H(uint64_t n) { return BlockHash{.low = n, .high = ~n}; }

std::vector<BlockId> Ids(std::initializer_list<int32_t> ids) {
  std::vector<BlockId> out;
  for (int32_t id : ids) out.push_back(BlockId{id});
  return out;
}

void ExpectPartition(const BlockPool& pool) {
  EXPECT_EQ(pool.num_free_blocks() + pool.num_cached_blocks() + pool.num_used_blocks(), pool.num_blocks());
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

TEST(BlockPoolTest, CreateRejectsEmptyPools) {
  EXPECT_EQ(BlockPool::Create({.num_blocks = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockPool::Create({.num_blocks = 4, .block_size_tokens = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, AllocateFailsWithoutSideEffectsWhenPoolTooSmall) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  EXPECT_EQ(pool->Allocate(5).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free_blocks(), 4);
  ASSERT_TRUE(pool->Allocate(3).ok());
  const std::vector<BlockId> before = pool->AllocatableBlocksInOrder();
  EXPECT_EQ(pool->Allocate(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->AllocatableBlocksInOrder(), before);
  EXPECT_EQ(pool->num_used_blocks(), 3);
  EXPECT_EQ(pool->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool->Allocate(0).value().empty());
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, AllocatesInIdOrderWithOneReferenceEach) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  const std::vector<BlockId> blocks = pool->Allocate(3).value();
  EXPECT_EQ(blocks, Ids({0, 1, 2}));
  for (BlockId b : blocks) EXPECT_EQ(pool->ref_count(b), 1);
  EXPECT_EQ(pool->num_used_blocks(), 3);
  EXPECT_EQ(pool->num_free_blocks(), 1);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, ReleaseFreesAtZeroReferencesInTheGivenOrder) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  const std::vector<BlockId> blocks = pool->Allocate(4).value();
  ASSERT_TRUE(pool->Touch(Ids({1})).ok());
  ASSERT_TRUE(pool->Release(Ids({3, 1, 0})).ok());
  EXPECT_EQ(pool->ref_count(BlockId{1}), 1);
  EXPECT_EQ(pool->AllocatableBlocksInOrder(), Ids({3, 0}));
  // Allocation takes the first released first.
  EXPECT_EQ(pool->Allocate(1).value(), Ids({3}));
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, DoubleFreeIsRejectedAndChangesNothing) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  ASSERT_TRUE(pool->Allocate(2).ok());
  ASSERT_TRUE(pool->Release(Ids({0})).ok());
  // Block 1 would be released, then block 0 underflows: neither may change.
  EXPECT_EQ(pool->Release(Ids({1, 0})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ref_count(BlockId{1}), 1);
  // Listing a block twice drops two references.
  EXPECT_EQ(pool->Release(Ids({1, 1})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ref_count(BlockId{1}), 1);
  EXPECT_EQ(pool->Release(Ids({7})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->num_used_blocks(), 1);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, ReleasingABlockListedTwiceLinksItOnce) {
  auto pool = BlockPool::Create({.num_blocks = 2}).value();
  ASSERT_TRUE(pool->Allocate(1).ok());
  ASSERT_TRUE(pool->Touch(Ids({0})).ok());
  ASSERT_TRUE(pool->Release(Ids({0, 0})).ok());
  EXPECT_EQ(pool->num_free_blocks(), 2);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, FreedFullBlockStaysCachedAndIsRevivedByTouch) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  const BlockId b = pool->Allocate(1).value()[0];
  ASSERT_TRUE(pool->CacheBlock(b, H(1), kRootBlockHash).value());
  ASSERT_TRUE(pool->Release({&b, 1}).ok());
  EXPECT_EQ(pool->num_cached_blocks(), 1);
  EXPECT_EQ(pool->num_free_blocks(), 3);
  EXPECT_EQ(pool->num_used_blocks(), 0);
  EXPECT_EQ(pool->LookupCached(H(1)), b);
  ExpectPartition(*pool);

  ASSERT_TRUE(pool->Touch({&b, 1}).ok());  // a prefix hit
  EXPECT_EQ(pool->ref_count(b), 1);
  EXPECT_EQ(pool->num_cached_blocks(), 0);
  EXPECT_EQ(pool->num_used_blocks(), 1);
  EXPECT_EQ(pool->block_hash(b), H(1));
  // No longer allocatable: the three free blocks are all there is.
  EXPECT_EQ(pool->Allocate(4).status().code(), absl::StatusCode::kResourceExhausted);
  const std::vector<BlockId> others = pool->Allocate(3).value();
  EXPECT_EQ(std::count(others.begin(), others.end(), b), 0);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, TouchRejectsFreeBlocksWithoutCachedData) {
  auto pool = BlockPool::Create({.num_blocks = 2}).value();
  EXPECT_EQ(pool->Touch(Ids({0})).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Touch(Ids({9})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->num_free_blocks(), 2);
}

TEST(BlockPoolTest, EvictsFreeBlocksFirstThenCachedBlocksLeastRecentlyReleasedFirst) {
  auto pool = BlockPool::Create({.num_blocks = 5, .block_size_tokens = 4}).value();
  const std::vector<BlockId> b = pool->Allocate(5).value();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool->CacheBlock(b[i], H(10 + i), H(9 + i)).value());
  // Release cached blocks 2, 0, 1 (in that LRU order) and the unhashed 3, 4.
  ASSERT_TRUE(pool->Release(Ids({2, 3, 0})).ok());
  ASSERT_TRUE(pool->Release(Ids({1, 4})).ok());
  EXPECT_EQ(pool->num_free_blocks(), 2);
  EXPECT_EQ(pool->num_cached_blocks(), 3);
  EXPECT_EQ(pool->AllocatableBlocksInOrder(), Ids({3, 4, 2, 0, 1}));
  ASSERT_EQ(pool->DrainEvents().size(), 3u);  // the three kStored

  // Free blocks go first and evict nothing.
  EXPECT_EQ(pool->Allocate(2).value(), Ids({3, 4}));
  EXPECT_TRUE(pool->DrainEvents().empty());
  // Then the oldest cached block: its hash is gone and a kRemoved is reported.
  EXPECT_EQ(pool->Allocate(1).value(), Ids({2}));
  EXPECT_FALSE(pool->LookupCached(H(12)).has_value());
  EXPECT_FALSE(pool->block_hash(BlockId{2}).has_value());
  const std::vector<KvEvent> events = pool->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], (KvEvent{.kind = KvEvent::Kind::kRemoved,
                                .block_hash = H(12),
                                .parent_hash = H(11),
                                .tier = Tier::kDevice,
                                .num_tokens = 4}));
  // A revived block leaves the LRU order; the next eviction is block 1.
  ASSERT_TRUE(pool->Touch(Ids({0})).ok());
  EXPECT_EQ(pool->Allocate(1).value(), Ids({1}));
  EXPECT_EQ(pool->DrainEvents()[0].block_hash, H(11));
  EXPECT_EQ(pool->num_evictions(), 2);
  EXPECT_EQ(pool->LookupCached(H(10)), BlockId{0});
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, CacheBlockRegistersEachHashOnceWithOneEvent) {
  auto pool = BlockPool::Create({.num_blocks = 3, .tier = Tier::kHost}).value();
  const std::vector<BlockId> b = pool->Allocate(2).value();
  EXPECT_TRUE(pool->CacheBlock(b[0], H(1), kRootBlockHash).value());
  // Again with the same hash: nothing new.
  EXPECT_FALSE(pool->CacheBlock(b[0], H(1), kRootBlockHash).value());
  // Another block with a hash that is cached already: stays unregistered.
  EXPECT_FALSE(pool->CacheBlock(b[1], H(1), kRootBlockHash).value());
  EXPECT_FALSE(pool->block_hash(b[1]).has_value());
  EXPECT_EQ(pool->LookupCached(H(1)), b[0]);
  // A different hash on a hashed block is a caller bug.
  EXPECT_EQ(pool->CacheBlock(b[0], H(2), kRootBlockHash).status().code(), absl::StatusCode::kFailedPrecondition);
  // Only blocks in use can be registered.
  EXPECT_EQ(pool->CacheBlock(BlockId{2}, H(3), kRootBlockHash).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->CacheBlock(BlockId{3}, H(3), kRootBlockHash).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<KvEvent> events = pool->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], (KvEvent{.kind = KvEvent::Kind::kStored,
                                .block_hash = H(1),
                                .parent_hash = kRootBlockHash,
                                .tier = Tier::kHost,
                                .num_tokens = kDefaultBlockSizeTokens}));
  EXPECT_TRUE(pool->DrainEvents().empty());
  EXPECT_EQ(pool->num_stored(), 1);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, UsedBlocksKeepTheirHashUntilEvicted) {
  auto pool = BlockPool::Create({.num_blocks = 1}).value();
  const BlockId b = pool->Allocate(1).value()[0];
  ASSERT_TRUE(pool->CacheBlock(b, H(5), kRootBlockHash).value());
  ASSERT_TRUE(pool->Release({&b, 1}).ok());
  // Re-allocating the only block evicts it, exactly once.
  EXPECT_EQ(pool->Allocate(1).value()[0], b);
  ASSERT_TRUE(pool->Release({&b, 1}).ok());
  EXPECT_EQ(pool->Allocate(1).value()[0], b);
  const std::vector<KvEvent> events = pool->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[1].block_hash, H(5));
}

TEST(BlockPoolTest, EvictCachedDropsOldestHashesAndReportsThem) {
  auto pool = BlockPool::Create({.num_blocks = 4}).value();
  const std::vector<BlockId> b = pool->Allocate(3).value();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool->CacheBlock(b[i], H(i), kRootBlockHash).value());
  ASSERT_TRUE(pool->Release(Ids({2, 1, 0})).ok());
  (void)pool->DrainEvents();
  EXPECT_EQ(pool->EvictCached(2), 2);
  EXPECT_EQ(pool->num_cached_blocks(), 1);
  EXPECT_EQ(pool->num_free_blocks(), 3);
  EXPECT_EQ(pool->LookupCached(H(0)), BlockId{0});
  std::vector<KvEvent> events = pool->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].block_hash, H(2));
  EXPECT_EQ(events[1].block_hash, H(1));
  EXPECT_EQ(pool->EvictCached(100), 1);
  EXPECT_EQ(pool->EvictCached(100), 0);
  EXPECT_EQ(pool->num_hashed_blocks(), 0);
  ExpectPartition(*pool);
}

TEST(BlockPoolTest, DisabledPrefixCacheRegistersNothing) {
  auto pool = BlockPool::Create({.num_blocks = 2, .enable_prefix_cache = false}).value();
  const BlockId b = pool->Allocate(1).value()[0];
  EXPECT_FALSE(pool->CacheBlock(b, H(1), kRootBlockHash).value());
  ASSERT_TRUE(pool->Release({&b, 1}).ok());
  EXPECT_EQ(pool->num_cached_blocks(), 0);
  EXPECT_FALSE(pool->LookupCached(H(1)).has_value());
  EXPECT_TRUE(pool->DrainEvents().empty());
}

TEST(BlockPoolTest, RecordEventsOffKeepsTheQueueEmpty) {
  auto pool = BlockPool::Create({.num_blocks = 1, .record_events = false}).value();
  const BlockId b = pool->Allocate(1).value()[0];
  EXPECT_TRUE(pool->CacheBlock(b, H(1), kRootBlockHash).value());
  ASSERT_TRUE(pool->Release({&b, 1}).ok());
  ASSERT_TRUE(pool->Allocate(1).ok());
  EXPECT_EQ(pool->num_pending_events(), 0);
  EXPECT_EQ(pool->num_stored(), 1);
  EXPECT_EQ(pool->num_evictions(), 1);
}

}  // namespace
}  // namespace kvmesh::kv
