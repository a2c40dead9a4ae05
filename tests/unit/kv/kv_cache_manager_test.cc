#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "kv/block_hash.h"

namespace kvmesh::kv {
namespace {

constexpr int32_t kBs = 4;  // small blocks keep the tests readable

std::unique_ptr<KvCacheManager> Make(int32_t num_blocks, int32_t block_size = kBs, bool prefix_caching = true,
                                     uint64_t salt = 0) {
  return KvCacheManager::Create({.num_blocks = num_blocks,
                                 .block_size_tokens = block_size,
                                 .enable_prefix_caching = prefix_caching,
                                 .salt = salt})
      .value();
}

std::vector<int32_t> Tokens(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<BlockId> Table(const KvCacheManager& m, RequestId id) {
  const std::span<const BlockId> t = m.block_table(id);
  return {t.begin(), t.end()};
}

// Runs a whole prompt as one prefill with whatever prefix is cached; returns the prefix.
ComputedPrefix Prefill(KvCacheManager& m, RequestId id, const std::vector<int32_t>& prompt) {
  ComputedPrefix prefix = m.FindCachedPrefix(prompt);
  const int32_t n = static_cast<int32_t>(prompt.size()) - prefix.num_tokens;
  EXPECT_TRUE(m.AllocateSlots(id, prompt, n, &prefix).ok());
  EXPECT_TRUE(m.MarkComputed(id, prompt, static_cast<int32_t>(prompt.size())).ok());
  return prefix;
}

// One decode step: the sampled `token` is appended and its KV computed.
absl::StatusOr<KvAllocation> Decode(KvCacheManager& m, RequestId id, std::vector<int32_t>& tokens, int32_t token) {
  tokens.push_back(token);
  absl::StatusOr<KvAllocation> a = m.AllocateSlots(id, tokens, 1);
  if (!a.ok()) {
    tokens.pop_back();
    return a;
  }
  EXPECT_TRUE(m.MarkComputed(id, tokens, static_cast<int32_t>(tokens.size())).ok());
  return a;
}

void ExpectInvariants(const KvCacheManager& m) {
  const absl::Status s = m.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s;
}

TEST(KvCacheManagerTest, CreateRejectsBadOptions) {
  EXPECT_EQ(KvCacheManager::Create({.num_blocks = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create({.num_blocks = 8, .block_size_tokens = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheManagerTest, AllocatesBlocksAndSlotsForAPrompt) {
  auto m = Make(8);
  const std::vector<int32_t> prompt = Tokens(10);
  const RequestId r{1};
  const KvAllocation a = m->AllocateSlots(r, prompt, 10).value();
  EXPECT_EQ(a.new_blocks.size(), 3u);  // ceil(10 / 4)
  EXPECT_TRUE(a.copies.empty());
  EXPECT_EQ(Table(*m, r), a.new_blocks);
  ASSERT_EQ(a.slot_mapping.slots.size(), 10u);
  EXPECT_EQ(a.slot_mapping.first_position, 0);
  for (int p = 0; p < 10; ++p) {
    EXPECT_EQ(a.slot_mapping.slots[p], int64_t{a.new_blocks[p / kBs].value} * kBs + p % kBs);
  }
  EXPECT_EQ(m->num_computed_tokens(r), 0);
  ASSERT_TRUE(m->MarkComputed(r, prompt, 10).ok());
  EXPECT_EQ(m->num_computed_tokens(r), 10);
  EXPECT_EQ(m->num_used_blocks(), 3);
  EXPECT_DOUBLE_EQ(m->usage(), 3.0 / 8);
  // Two full blocks were registered.
  EXPECT_EQ(m->pool().num_hashed_blocks(), 2);

  // Decode: positions 10 and 11 fit in block 2; position 12 needs a new block.
  std::vector<int32_t> tokens = prompt;
  EXPECT_TRUE(Decode(*m, r, tokens, 7).value().new_blocks.empty());
  EXPECT_TRUE(Decode(*m, r, tokens, 8).value().new_blocks.empty());
  EXPECT_EQ(m->pool().num_hashed_blocks(), 3);  // block 2 became full
  const KvAllocation d = Decode(*m, r, tokens, 9).value();
  ASSERT_EQ(d.new_blocks.size(), 1u);
  EXPECT_EQ(d.slot_mapping.first_position, 12);
  EXPECT_EQ(d.slot_mapping.slots, std::vector<int64_t>{int64_t{d.new_blocks[0].value} * kBs});
  EXPECT_EQ(m->GetSlotMapping(r, 12, 1).value().slots, d.slot_mapping.slots);
  EXPECT_EQ(m->GetSlotMapping(r, 14, 3).status().code(), absl::StatusCode::kOutOfRange);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, AllocationFailureHasNoSideEffects) {
  auto m = Make(4);
  const std::vector<int32_t> a_prompt = Tokens(8);
  Prefill(*m, RequestId{1}, a_prompt);  // 2 blocks, both cached-able
  const std::vector<int32_t> big = Tokens(13, 500);
  EXPECT_EQ(m->AllocateSlots(RequestId{2}, big, 13).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(m->HasRequest(RequestId{2}));
  EXPECT_EQ(m->num_used_blocks(), 2);
  EXPECT_EQ(m->num_free_blocks(), 2);
  // An existing request that cannot grow keeps its table and count.
  std::vector<int32_t> tokens = a_prompt;
  tokens.insert(tokens.end(), {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(m->AllocateSlots(RequestId{1}, tokens, 9).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Table(*m, RequestId{1}).size(), 2u);
  EXPECT_EQ(m->num_computed_tokens(RequestId{1}), 8);
  EXPECT_TRUE(m->DrainEvents().size() == 2);  // only the prefill's two kStored
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, AllocationCountsCachedPrefixBlocksItRevives) {
  // The prefix hit takes 2 cached blocks off the eviction list: with 4 blocks in all,
  // a 13-token prompt (2 cached + 2 new blocks) fits, a 17-token one (2 + 3) does not.
  auto m = Make(4);
  const std::vector<int32_t> long_prompt = Tokens(17);
  Prefill(*m, RequestId{1}, Tokens(9));
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  EXPECT_EQ(m->num_cached_blocks(), 2);
  ComputedPrefix prefix = m->FindCachedPrefix(long_prompt);
  ASSERT_EQ(prefix.blocks.size(), 2u);
  EXPECT_EQ(m->AllocateSlots(RequestId{2}, long_prompt, 9, &prefix).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m->num_cached_blocks(), 2);
  EXPECT_EQ(m->pool().ref_count(prefix.blocks[0]), 0);
  EXPECT_FALSE(m->HasRequest(RequestId{2}));
  const std::vector<int32_t> prompt = Tokens(13);
  prefix = m->FindCachedPrefix(prompt);
  const KvAllocation a = m->AllocateSlots(RequestId{2}, prompt, 5, &prefix).value();
  EXPECT_EQ(a.new_blocks.size(), 2u);
  EXPECT_EQ(m->num_used_blocks(), 4);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, ReusesLeadingFullBlocksAcrossRequests) {
  auto m = Make(16);
  std::vector<int32_t> system = Tokens(9);  // 2 full blocks + 1 token
  std::vector<int32_t> a = system;
  a.insert(a.end(), {1, 2, 3, 4, 5});
  std::vector<int32_t> b = system;
  b.insert(b.end(), {6, 7, 8});
  const ComputedPrefix pa = Prefill(*m, RequestId{1}, a);
  EXPECT_EQ(pa.num_tokens, 0);
  const ComputedPrefix pb = Prefill(*m, RequestId{2}, b);
  ASSERT_EQ(pb.blocks.size(), 2u);
  EXPECT_EQ(pb.num_tokens, 8);
  const std::vector<BlockId> ta = Table(*m, RequestId{1});
  const std::vector<BlockId> tb = Table(*m, RequestId{2});
  ASSERT_EQ(tb.size(), 3u);
  EXPECT_EQ(tb[0], ta[0]);
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_NE(tb[2], ta[2]);  // block 2 differs (token 8 is shared, tokens 9.. are not)
  EXPECT_EQ(m->pool().ref_count(ta[0]), 2);
  EXPECT_EQ(m->pool().ref_count(ta[1]), 2);
  EXPECT_EQ(m->pool().ref_count(ta[2]), 1);
  EXPECT_EQ(m->num_computed_tokens(RequestId{2}), 12);
  const PrefixCacheStats& s = m->prefix_cache_stats();
  EXPECT_EQ(s.queries, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.prefix_cache_queries_tokens, 14 + 12);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 8);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 8.0 / 26);

  // After A and B leave, a third request revives the cached blocks.
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  ASSERT_TRUE(m->Free(RequestId{2}).ok());
  EXPECT_EQ(m->num_used_blocks(), 0);
  const ComputedPrefix pc = m->FindCachedPrefix(a);
  EXPECT_EQ(pc.blocks, std::vector<BlockId>(ta.begin(), ta.begin() + 3));
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, AlwaysRecomputesTheLastPromptToken) {
  auto m = Make(16);
  const std::vector<int32_t> prompt = Tokens(12);  // exactly 3 full blocks
  Prefill(*m, RequestId{1}, prompt);
  // All 3 blocks are cached, but the lookup stops at 2: the last block must be recomputed.
  const ComputedPrefix again = m->FindCachedPrefix(prompt);
  EXPECT_EQ(again.blocks.size(), 2u);
  EXPECT_EQ(again.num_tokens, 8);
  EXPECT_EQ(again.block_hashes.size(), 3u);
  const KvAllocation a = m->AllocateSlots(RequestId{2}, prompt, 4, &again).value();
  EXPECT_EQ(a.new_blocks.size(), 1u);
  EXPECT_EQ(a.slot_mapping.first_position, 8);
  // Completing it finds the block cached by request 1 already: no second registration.
  (void)m->DrainEvents();
  ASSERT_TRUE(m->MarkComputed(RequestId{2}, prompt, 12).ok());
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_FALSE(m->pool().block_hash(a.new_blocks[0]).has_value());
  // One token more than a block boundary: every full block is a hit.
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  EXPECT_EQ(m->FindCachedPrefix(longer).num_tokens, 12);
  EXPECT_EQ(m->FindCachedPrefix(Tokens(1)).num_tokens, 0);
  EXPECT_EQ(m->FindCachedPrefix({}).num_tokens, 0);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, StalePrefixIsRejected) {
  auto m = Make(8);
  const std::vector<int32_t> prompt = Tokens(9);
  Prefill(*m, RequestId{1}, prompt);
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  ComputedPrefix prefix = m->FindCachedPrefix(prompt);
  ASSERT_EQ(prefix.blocks.size(), 2u);
  EXPECT_EQ(m->EvictCachedBlocks(100), 2);
  EXPECT_EQ(m->AllocateSlots(RequestId{2}, prompt, 1, &prefix).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(m->HasRequest(RequestId{2}));
  // A prefix only seeds a new request.
  Prefill(*m, RequestId{3}, prompt);
  std::vector<int32_t> more = prompt;
  more.push_back(5);
  prefix = m->FindCachedPrefix(more);
  ASSERT_FALSE(prefix.blocks.empty());
  EXPECT_EQ(m->AllocateSlots(RequestId{3}, more, 1, &prefix).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, SaltsSeparateModels) {
  const std::vector<int32_t> prompt = Tokens(16);
  auto hashes_of = [&](uint64_t salt) {
    auto m = Make(8, kBs, true, salt);
    Prefill(*m, RequestId{1}, prompt);
    std::vector<BlockHash> out;
    for (const KvEvent& e : m->DrainEvents()) out.push_back(e.block_hash);
    return out;
  };
  const std::vector<BlockHash> a = hashes_of(0xA);
  ASSERT_EQ(a.size(), 4u);
  // The same model on another worker reports the same hashes (the global index relies
  // on it); another model (adapter) never does.
  EXPECT_EQ(hashes_of(0xA), a);
  const std::vector<BlockHash> b = hashes_of(0xB);
  for (const BlockHash& h : b) EXPECT_EQ(std::count(a.begin(), a.end(), h), 0);
}

TEST(KvCacheManagerTest, ForkSharesBlocksAndCopiesTheLastOnWrite) {
  auto m = Make(16);
  const RequestId parent{1};
  const RequestId child{2};
  std::vector<int32_t> tokens = Tokens(6);  // block 0 full, block 1 holds 2 tokens
  Prefill(*m, parent, tokens);
  ASSERT_TRUE(m->Fork(parent, child).ok());
  const std::vector<BlockId> shared = Table(*m, parent);
  EXPECT_EQ(Table(*m, child), shared);
  EXPECT_EQ(m->num_computed_tokens(child), 6);
  EXPECT_EQ(m->pool().ref_count(shared[0]), 2);
  EXPECT_EQ(m->pool().ref_count(shared[1]), 2);

  // The child writes position 6 into the shared partial block: copy on write.
  std::vector<int32_t> child_tokens = tokens;
  const KvAllocation c = Decode(*m, child, child_tokens, 77).value();
  ASSERT_EQ(c.copies.size(), 1u);
  const BlockId fresh = c.copies[0].dst;
  EXPECT_EQ(c.copies[0], (BlockCopy{shared[1], fresh}));
  EXPECT_TRUE(c.new_blocks.empty());
  EXPECT_EQ(Table(*m, child), (std::vector<BlockId>{shared[0], fresh}));
  EXPECT_EQ(Table(*m, parent), shared);
  EXPECT_EQ(c.slot_mapping.slots, std::vector<int64_t>{int64_t{fresh.value} * kBs + 2});
  EXPECT_EQ(m->pool().ref_count(shared[0]), 2);
  EXPECT_EQ(m->pool().ref_count(shared[1]), 1);
  EXPECT_EQ(m->pool().ref_count(fresh), 1);

  // The parent now owns its last block alone: it writes in place.
  const KvAllocation p = Decode(*m, parent, tokens, 88).value();
  EXPECT_TRUE(p.copies.empty());
  EXPECT_EQ(p.slot_mapping.slots, std::vector<int64_t>{int64_t{shared[1].value} * kBs + 2});
  EXPECT_EQ(m->Fork(RequestId{9}, RequestId{10}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->Fork(parent, child).code(), absl::StatusCode::kAlreadyExists);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, PrepareAppendCopiesASharedPartialBlockOnce) {
  auto m = Make(3);
  std::vector<int32_t> tokens = Tokens(5);
  Prefill(*m, RequestId{1}, tokens);  // blocks 0 (full), 1 (1 token)
  ASSERT_TRUE(m->Fork(RequestId{1}, RequestId{2}).ok());
  const std::vector<BlockId> shared = Table(*m, RequestId{1});
  const std::optional<BlockCopy> copy = m->PrepareAppend(RequestId{2}).value();
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, shared[1]);
  EXPECT_EQ(Table(*m, RequestId{2})[1], copy->dst);
  EXPECT_FALSE(m->PrepareAppend(RequestId{2}).value().has_value());
  EXPECT_FALSE(m->PrepareAppend(RequestId{1}).value().has_value());
  // A third sample cannot get its own block: the pool is full, nothing changes.
  ASSERT_TRUE(m->Fork(RequestId{1}, RequestId{3}).ok());
  EXPECT_EQ(m->PrepareAppend(RequestId{3}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Table(*m, RequestId{3}), shared);
  EXPECT_EQ(m->PrepareAppend(RequestId{4}).status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, FreeReleasesTailBlocksFirst) {
  auto m = Make(8);
  const std::vector<int32_t> prompt = Tokens(14);  // 3 full blocks + 2 tokens
  Prefill(*m, RequestId{1}, prompt);
  const std::vector<BlockId> t = Table(*m, RequestId{1});
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  EXPECT_FALSE(m->HasRequest(RequestId{1}));
  EXPECT_EQ(m->Free(RequestId{1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->num_cached_blocks(), 3);
  // Free blocks first (the never-used 4..7, then the partial tail block 3), then cached
  // blocks tail first: block 2 is evicted before 1, and 1 before 0.
  const std::vector<BlockId> order = m->pool().AllocatableBlocksInOrder();
  ASSERT_EQ(order.size(), 8u);
  EXPECT_EQ(order[4], t[3]);
  EXPECT_EQ(std::vector<BlockId>(order.begin() + 5, order.end()), (std::vector<BlockId>{t[2], t[1], t[0]}));
  (void)m->DrainEvents();
  ASSERT_TRUE(m->AllocateSlots(RequestId{2}, Tokens(24, 900), 24).ok());  // 6 blocks: evicts t[2]
  const std::vector<KvEvent> events = m->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block_hash, HashFullBlocks(prompt, kBs, 0)[2]);
  // The prefix is still cached, up to the evicted block.
  EXPECT_EQ(m->FindCachedPrefix(prompt).num_tokens, 8);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, EmitsOneEventPerStoreAndPerEviction) {
  auto m = Make(6);
  const std::vector<int32_t> prompt = Tokens(8);
  // Two requests compute the same prompt without sharing (both look up before either
  // has computed): the duplicate blocks are stored once.
  const ComputedPrefix p1 = m->FindCachedPrefix(prompt);
  const ComputedPrefix p2 = m->FindCachedPrefix(prompt);
  ASSERT_TRUE(m->AllocateSlots(RequestId{1}, prompt, 8, &p1).ok());
  ASSERT_TRUE(m->AllocateSlots(RequestId{2}, prompt, 8, &p2).ok());
  ASSERT_TRUE(m->MarkComputed(RequestId{1}, prompt, 4).ok());
  ASSERT_TRUE(m->MarkComputed(RequestId{1}, prompt, 8).ok());
  ASSERT_TRUE(m->MarkComputed(RequestId{1}, prompt, 8).ok());
  ASSERT_TRUE(m->MarkComputed(RequestId{2}, prompt, 8).ok());
  std::vector<KvEvent> events = m->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  const std::vector<BlockHash> h = HashFullBlocks(prompt, kBs, 0);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[0].block_hash, h[0]);
  EXPECT_EQ(events[0].parent_hash, kRootBlockHash);
  EXPECT_EQ(events[1].block_hash, h[1]);
  EXPECT_EQ(events[1].parent_hash, h[0]);
  EXPECT_EQ(events[1].num_tokens, kBs);
  // Freeing request 2 (unregistered duplicates) evicts nothing and reports nothing;
  // its blocks are plain free blocks.
  ASSERT_TRUE(m->Free(RequestId{2}).ok());
  EXPECT_TRUE(m->DrainEvents().empty());
  EXPECT_EQ(m->num_cached_blocks(), 0);
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  EXPECT_EQ(m->num_cached_blocks(), 2);
  EXPECT_EQ(m->EvictCachedBlocks(10), 2);
  events = m->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block_hash, h[1]);  // tail first
  EXPECT_EQ(events[1].block_hash, h[0]);
  EXPECT_EQ(m->EvictCachedBlocks(10), 0);
  EXPECT_TRUE(m->DrainEvents().empty());
  ExpectInvariants(*m);
}

// Held blocks stay out of use whoever frees them, count as used, and return to the pool
// only when released; a release of a block not held changes nothing.
TEST(KvCacheManagerTest, HeldBlocksAreNotHandedOutUntilReleased) {
  auto m = Make(4);
  ASSERT_TRUE(m->AllocateSlots(RequestId{1}, Tokens(8), 8).ok());
  const std::vector<BlockId> leased = Table(*m, RequestId{1});
  ASSERT_EQ(leased.size(), 2u);
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  ASSERT_TRUE(m->HoldBlocks(leased).ok());  // freed already: taken back out of the pool
  EXPECT_EQ(m->num_held_blocks(), 2);
  EXPECT_EQ(m->num_used_blocks(), 2);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  EXPECT_EQ(m->AllocateSlots(RequestId{2}, Tokens(12), 12).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m->AllocateSlots(RequestId{2}, Tokens(8), 8).ok());
  for (const BlockId b : Table(*m, RequestId{2})) EXPECT_EQ(std::count(leased.begin(), leased.end(), b), 0);
  const std::vector<BlockId> twice = {leased[0], leased[0]};  // held once
  EXPECT_EQ(m->ReleaseHeldBlocks(twice).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->num_held_blocks(), 2);
  ASSERT_TRUE(m->ReleaseHeldBlocks(leased).ok());
  EXPECT_EQ(m->num_held_blocks(), 0);
  EXPECT_EQ(m->num_free_blocks(), 2);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
}

TEST(KvCacheManagerTest, MarkComputedValidatesCounts) {
  auto m = Make(4);
  const std::vector<int32_t> prompt = Tokens(6);
  EXPECT_EQ(m->MarkComputed(RequestId{1}, prompt, 1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->AllocateSlots(RequestId{1}, prompt, 5).ok());  // 2 blocks = 8 slots
  ASSERT_TRUE(m->MarkComputed(RequestId{1}, prompt, 5).ok());
  EXPECT_EQ(m->MarkComputed(RequestId{1}, prompt, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->MarkComputed(RequestId{1}, prompt, 7).code(), absl::StatusCode::kInvalidArgument);  // > tokens
  EXPECT_EQ(m->AllocateSlots(RequestId{1}, prompt, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->AllocateSlots(RequestId{1}, prompt, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->num_computed_tokens(RequestId{1}), 5);
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, DisabledPrefixCachingSharesNothing) {
  auto m = Make(8, kBs, /*prefix_caching=*/false);
  const std::vector<int32_t> prompt = Tokens(9);
  Prefill(*m, RequestId{1}, prompt);
  const ComputedPrefix p = m->FindCachedPrefix(prompt);
  EXPECT_TRUE(p.blocks.empty());
  EXPECT_EQ(m->prefix_cache_stats().queries, 0);
  ASSERT_TRUE(m->Free(RequestId{1}).ok());
  EXPECT_EQ(m->num_cached_blocks(), 0);
  EXPECT_EQ(m->num_free_blocks(), 8);
  EXPECT_TRUE(m->DrainEvents().empty());
  ExpectInvariants(*m);
}

TEST(KvCacheManagerTest, UsageCountsSharedBlocksOnceAndWasteInPartialBlocks) {
  auto m = Make(16);
  Prefill(*m, RequestId{1}, Tokens(10));  // 3 blocks, 10 filled slots
  ASSERT_TRUE(m->Fork(RequestId{1}, RequestId{2}).ok());
  KvUsage u = m->GetUsage();
  EXPECT_EQ(u.used_blocks, 3);
  EXPECT_EQ(u.allocated_slots, 12);
  EXPECT_EQ(u.filled_slots, 10);
  EXPECT_EQ(u.wasted_slots, 2);
  EXPECT_EQ(u.free_blocks + u.cached_blocks + u.used_blocks, 16);
  // Allocated but not yet computed slots are waste until MarkComputed.
  ASSERT_TRUE(m->AllocateSlots(RequestId{3}, Tokens(5, 7), 5).ok());
  u = m->GetUsage();
  EXPECT_EQ(u.allocated_slots, 20);
  EXPECT_EQ(u.filled_slots, 10);
  EXPECT_DOUBLE_EQ(u.usage, 5.0 / 16);
}

// ---------------------------------------------------------------------------------
// Allocator invariants under a seeded random workload.
//
// A small pool (24 blocks of 4 tokens) serves requests built from a few shared
// "system prompts" plus random suffixes over a tiny vocabulary (so unrelated requests
// also produce equal blocks), prefilled in random chunks, decoded token by token,
// forked, freed and preempted (freed) when the pool runs out, with explicit evictions
// sprinkled in. A shadow memory records which token each slot holds, as the model
// would write it; after EVERY operation the test checks that:
//   - CheckInvariants() holds: lists, counts, hash map, ref_count == number of tables;
//   - independently: ref_count(b) == tables holding b; a block is allocatable iff no
//     table holds it; free + cached + used == num_blocks;
//   - every computed position of every request reads back its own token from the
//     shadow memory (prefix hits, copy-on-write and eviction never corrupt KV);
//   - the hash map is exactly the set of hashes whose kStored was reported and whose
//     kRemoved was not, and each maps to a block whose contents hash to it.
// A failed allocation must change nothing (compared against a full snapshot).

struct Snapshot {
  std::vector<BlockId> allocatable;
  std::map<int64_t, std::vector<BlockId>> tables;
  std::map<int64_t, int32_t> computed;
  int32_t used = 0;
  int32_t cached = 0;
  int64_t pending_events = 0;
  bool operator==(const Snapshot&) const = default;
};

class RandomWorkload {
 public:
  static constexpr int32_t kNumBlocks = 24;
  static constexpr int32_t kBlockSize = 4;
  static constexpr int32_t kMaxTokens = 48;
  static constexpr int32_t kMaxLive = 10;

  explicit RandomWorkload(uint32_t seed) : rng_(seed), shadow_(kNumBlocks * kBlockSize, -1) {
    m_ = KvCacheManager::Create({.num_blocks = kNumBlocks, .block_size_tokens = kBlockSize, .salt = 99}).value();
    for (int i = 0; i < 4; ++i) system_prompts_.push_back(RandomTokens(Uniform(0, 13)));
  }

  void Step() {
    const int op = Uniform(0, 99);
    if (op < 22 || live_.empty()) {
      NewRequest();
    } else if (op < 70) {
      Advance(PickLive());
    } else if (op < 78) {
      ForkRequest(PickLive());
    } else if (op < 92) {
      FreeRequest(PickLive());
    } else if (op < 96) {
      m_->EvictCachedBlocks(Uniform(0, 6));
    } else {
      PrepareAppendOn(PickLive());
    }
    ++steps_;
    CheckAll();
  }

  int64_t steps() const { return steps_; }
  int64_t failures() const { return failures_; }
  int64_t forks() const { return forks_; }
  int64_t copies() const { return copies_; }
  int64_t evicted() const { return m_->pool().num_evictions(); }
  int64_t hit_tokens() const { return m_->prefix_cache_stats().prefix_cache_hit_tokens; }
  int64_t stale() const { return stale_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::vector<int32_t> RandomTokens(int n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = Uniform(0, 2);
    return v;
  }
  RequestId PickLive() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return RequestId{it->first};
  }

  Snapshot Snap() const {
    Snapshot s;
    s.allocatable = m_->pool().AllocatableBlocksInOrder();
    for (const auto& [id, tokens] : live_) {
      s.tables[id] = Table(*m_, RequestId{id});
      s.computed[id] = m_->num_computed_tokens(RequestId{id});
    }
    s.used = m_->num_used_blocks();
    s.cached = m_->num_cached_blocks();
    s.pending_events = m_->pool().num_pending_events();
    return s;
  }

  // The model "writes" its tokens: copies first, then one token per slot.
  void Write(const KvAllocation& a, const std::vector<int32_t>& tokens) {
    for (const BlockCopy& c : a.copies) {
      std::copy_n(shadow_.begin() + c.src.value * kBlockSize, kBlockSize, shadow_.begin() + c.dst.value * kBlockSize);
      ++copies_;
    }
    for (size_t i = 0; i < a.slot_mapping.slots.size(); ++i) {
      shadow_[a.slot_mapping.slots[i]] = tokens[a.slot_mapping.first_position + i];
    }
  }

  // Allocation ran out of blocks: it must have changed nothing. Then preempt someone.
  void OnExhausted(const Snapshot& before, absl::Status status) {
    ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    ASSERT_TRUE(Snap() == before) << "failed allocation had side effects at step " << steps_;
    ++failures_;
    FreeRequest(PickLive());
  }

  void NewRequest() {
    if (static_cast<int>(live_.size()) >= kMaxLive) return FreeRequest(PickLive());
    std::vector<int32_t> prompt = system_prompts_[Uniform(0, 3)];
    const std::vector<int32_t> suffix = RandomTokens(Uniform(1, 16));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const RequestId id{next_id_++};
    ComputedPrefix prefix = m_->FindCachedPrefix(prompt);
    ASSERT_LT(prefix.num_tokens, static_cast<int32_t>(prompt.size()));
    const std::vector<BlockHash> hashes = HashFullBlocks(prompt, kBlockSize, 99);
    ASSERT_EQ(prefix.block_hashes, hashes);
    for (size_t i = 0; i < prefix.blocks.size(); ++i) {
      ASSERT_EQ(m_->pool().block_hash(prefix.blocks[i]), hashes[i]);
    }
    // Now and then the prefix goes stale between lookup and allocation.
    bool maybe_stale = false;
    if (!prefix.blocks.empty() && Uniform(0, 19) == 0) {
      maybe_stale = m_->EvictCachedBlocks(kNumBlocks) > 0;
    }
    const int32_t remaining = static_cast<int32_t>(prompt.size()) - prefix.num_tokens;
    const int32_t chunk = std::min(remaining, Uniform(1, 12));
    const Snapshot before = Snap();
    absl::StatusOr<KvAllocation> a = m_->AllocateSlots(id, prompt, chunk, &prefix);
    if (a.status().code() == absl::StatusCode::kFailedPrecondition) {
      ASSERT_TRUE(maybe_stale) << a.status();
      ASSERT_TRUE(Snap() == before);
      ++stale_;
      return;
    }
    if (!a.ok()) return OnExhausted(before, a.status());
    ASSERT_TRUE(a->copies.empty());
    ASSERT_EQ(a->slot_mapping.first_position, prefix.num_tokens);
    Write(*a, prompt);
    ASSERT_TRUE(m_->MarkComputed(id, prompt, prefix.num_tokens + chunk).ok());
    live_[id.value] = std::move(prompt);
  }

  // One engine step for a request: the next prefill chunk, or one decode token.
  void Advance(RequestId id) {
    std::vector<int32_t>& tokens = live_[id.value];
    const int32_t computed = m_->num_computed_tokens(id);
    if (computed == static_cast<int32_t>(tokens.size())) {
      if (computed >= kMaxTokens) return FreeRequest(id);  // finished
      tokens.push_back(Uniform(0, 2));                    // sampled
    }
    const int32_t n = std::min(static_cast<int32_t>(tokens.size()) - computed, Uniform(1, 8));
    const Snapshot before = Snap();
    absl::StatusOr<KvAllocation> a = m_->AllocateSlots(id, tokens, n);
    if (!a.ok()) return OnExhausted(before, a.status());
    ASSERT_EQ(a->slot_mapping.first_position, computed);
    ASSERT_EQ(static_cast<int32_t>(a->slot_mapping.slots.size()), n);
    Write(*a, tokens);
    ASSERT_TRUE(m_->MarkComputed(id, tokens, computed + n).ok());
  }

  void ForkRequest(RequestId parent) {
    if (static_cast<int>(live_.size()) >= kMaxLive) return;
    const RequestId child{next_id_++};
    ASSERT_TRUE(m_->Fork(parent, child).ok());
    // The child continues from the parent's computed tokens only (it samples its own).
    std::vector<int32_t> tokens = live_[parent.value];
    tokens.resize(m_->num_computed_tokens(parent));
    live_[child.value] = std::move(tokens);
    ++forks_;
  }

  void FreeRequest(RequestId id) {
    ASSERT_TRUE(m_->Free(id).ok());
    live_.erase(id.value);
  }

  void PrepareAppendOn(RequestId id) {
    const Snapshot before = Snap();
    absl::StatusOr<std::optional<BlockCopy>> copy = m_->PrepareAppend(id);
    if (!copy.ok()) return OnExhausted(before, copy.status());
    if (copy->has_value()) {
      KvAllocation a;
      a.copies.push_back(**copy);
      Write(a, {});
    }
  }

  void CheckAll() {
    const absl::Status s = m_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << "step " << steps_ << ": " << s;
    const BlockPool& pool = m_->pool();
    ASSERT_EQ(pool.num_free_blocks() + pool.num_cached_blocks() + pool.num_used_blocks(), kNumBlocks);
    std::vector<int32_t> holders(kNumBlocks, 0);
    for (const auto& [id, tokens] : live_) {
      const std::vector<BlockId> table = Table(*m_, RequestId{id});
      const int32_t computed = m_->num_computed_tokens(RequestId{id});
      ASSERT_LE(computed, static_cast<int32_t>(tokens.size()));
      for (const BlockId b : table) ++holders[b.value];
      for (int32_t p = 0; p < computed; ++p) {
        ASSERT_EQ(shadow_[table[p / kBlockSize].value * kBlockSize + p % kBlockSize], tokens[p])
            << "request " << id << " position " << p << " step " << steps_;
      }
      // A hashed block of this request holds exactly the hash of its contents.
      const std::vector<BlockHash> hashes =
          HashFullBlocks(std::span<const int32_t>(tokens).first(computed), kBlockSize, 99);
      for (size_t i = 0; i < hashes.size(); ++i) {
        const std::optional<BlockHash> h = pool.block_hash(table[i]);
        if (h.has_value()) {
          ASSERT_EQ(*h, hashes[i]);
        }
      }
    }
    std::vector<uint8_t> allocatable(kNumBlocks, 0);
    for (const BlockId b : pool.AllocatableBlocksInOrder()) allocatable[b.value] = 1;
    for (int32_t b = 0; b < kNumBlocks; ++b) {
      ASSERT_EQ(pool.ref_count(BlockId{b}), holders[b]) << "block " << b;
      ASSERT_EQ(allocatable[b] == 1, holders[b] == 0) << "block " << b;
    }
    // Events: stored once, removed once, and the live set is the hash map.
    for (const KvEvent& e : m_->DrainEvents()) {
      if (e.kind == KvEvent::Kind::kStored) {
        ASSERT_TRUE(advertised_.insert(e.block_hash).second) << "stored twice";
      } else {
        ASSERT_EQ(advertised_.erase(e.block_hash), 1u) << "removed without store";
      }
    }
    ASSERT_EQ(static_cast<int32_t>(advertised_.size()), pool.num_hashed_blocks());
    for (const BlockHash& h : advertised_) {
      const std::optional<BlockId> b = pool.LookupCached(h);
      ASSERT_TRUE(b.has_value());
      ASSERT_EQ(pool.block_hash(*b), h);
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<KvCacheManager> m_;
  std::vector<std::vector<int32_t>> system_prompts_;
  std::map<int64_t, std::vector<int32_t>> live_;
  std::vector<int32_t> shadow_;  // token held by each slot
  absl::flat_hash_set<BlockHash> advertised_;
  int64_t next_id_ = 1;
  int64_t steps_ = 0;
  int64_t failures_ = 0;
  int64_t forks_ = 0;
  int64_t copies_ = 0;
  int64_t stale_ = 0;
};

class KvCacheManagerInvariantsTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(KvCacheManagerInvariantsTest, RandomWorkloadKeepsEveryInvariantAfterEveryStep) {
  RandomWorkload w(GetParam());
  for (int i = 0; i < 6000; ++i) {
    w.Step();
    if (HasFatalFailure()) return;
  }
  // The workload must actually exercise the interesting paths.
  EXPECT_EQ(w.steps(), 6000);
  EXPECT_GT(w.failures(), 50);
  EXPECT_GT(w.forks(), 100);
  EXPECT_GT(w.copies(), 50);
  EXPECT_GT(w.evicted(), 100);
  EXPECT_GT(w.hit_tokens(), 1000);
  EXPECT_GT(w.stale(), 0);
  std::printf("[ KV RANDOM ] seed %u, 6000 steps: %lld exhausted allocations, %lld forks, %lld copies-on-write, "
              "%lld evictions, %lld prefix-hit tokens, %lld stale prefixes\n",
              GetParam(), static_cast<long long>(w.failures()), static_cast<long long>(w.forks()),
              static_cast<long long>(w.copies()), static_cast<long long>(w.evicted()),
              static_cast<long long>(w.hit_tokens()), static_cast<long long>(w.stale()));
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvCacheManagerInvariantsTest, ::testing::Values(20240611u, 1u, 2u, 3u));

// ---------------------------------------------------------------------------------
// Memory efficiency. A trace of 1,000 requests (seed 7):
//   prompt length  log-uniform in [16, 2048]   (round(exp(U[ln 16, ln 2048])))
//   output length  uniform in [16, 512]
//   context cap    4096 (prompt + output; never binding with these ranges)
// Tokens are random over a 32,000 vocabulary (no prefix sharing). All 1,000 requests
// are admitted, prefilled in one step each, then decoded round-robin to their full
// length, so at the end all are resident together: the peak. Paged allocation (16-token
// blocks) wastes at most the unfilled tail of each request's last block; a contiguous
// allocation reserves the 4096-token context for every request.
TEST(KvCacheManagerMemoryTest, PagedAllocationWastesUnderFourPercentAtPeak) {
  constexpr int kRequests = 1000;
  constexpr int32_t kBlock = 16;
  constexpr int32_t kContext = 4096;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log_prompt(std::log(16.0), std::log(2048.0));
  std::uniform_int_distribution<int32_t> output(16, 512);
  std::uniform_int_distribution<int32_t> vocab(0, 31999);
  std::vector<std::vector<int32_t>> prompts(kRequests);
  std::vector<int32_t> outputs(kRequests);
  int64_t blocks_needed = 0;
  int64_t total_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    int32_t p = static_cast<int32_t>(std::lround(std::exp(log_prompt(rng))));
    p = std::clamp(p, 16, 2048);
    outputs[i] = std::min(output(rng), kContext - p);
    prompts[i].resize(p);
    for (int32_t& t : prompts[i]) t = vocab(rng);
    const int64_t n = p + outputs[i];
    total_tokens += n;
    blocks_needed += (n + kBlock - 1) / kBlock;
  }
  // A pool sized to the trace's peak, plus 1%: everything stays resident.
  const int32_t num_blocks = static_cast<int32_t>(blocks_needed + blocks_needed / 100);
  auto m = KvCacheManager::Create({.num_blocks = num_blocks, .block_size_tokens = kBlock, .record_events = false})
               .value();
  std::vector<std::vector<int32_t>> tokens = prompts;
  for (int i = 0; i < kRequests; ++i) {
    const ComputedPrefix prefix = m->FindCachedPrefix(tokens[i]);
    const int32_t n = static_cast<int32_t>(tokens[i].size()) - prefix.num_tokens;
    ASSERT_TRUE(m->AllocateSlots(RequestId{i}, tokens[i], n, &prefix).ok());
    ASSERT_TRUE(m->MarkComputed(RequestId{i}, tokens[i], static_cast<int32_t>(tokens[i].size())).ok());
  }
  for (int32_t step = 0; step < 512; ++step) {
    for (int i = 0; i < kRequests; ++i) {
      if (step >= outputs[i]) continue;
      tokens[i].push_back(vocab(rng));
      ASSERT_TRUE(m->AllocateSlots(RequestId{i}, tokens[i], 1).ok());
      ASSERT_TRUE(m->MarkComputed(RequestId{i}, tokens[i], static_cast<int32_t>(tokens[i].size())).ok());
    }
  }
  ASSERT_TRUE(m->CheckInvariants().ok());
  const KvUsage u = m->GetUsage();
  EXPECT_EQ(u.filled_slots, total_tokens);
  EXPECT_EQ(u.used_blocks, blocks_needed);
  EXPECT_EQ(u.allocated_slots, blocks_needed * kBlock);
  const double paged_waste = static_cast<double>(u.wasted_slots) / static_cast<double>(u.allocated_slots);
  const int64_t contiguous_slots = int64_t{kRequests} * kContext;
  const double contiguous_waste =
      static_cast<double>(contiguous_slots - total_tokens) / static_cast<double>(contiguous_slots);
  std::printf(
      "[ KV MEMORY ] %d requests, %lld tokens resident: paged(16-token blocks) allocated %lld slots, wasted %lld "
      "(%.2f%%) | contiguous(4096/request) allocated %lld slots, wasted %lld (%.2f%%) | %.1fx less KV memory\n",
      kRequests, static_cast<long long>(total_tokens), static_cast<long long>(u.allocated_slots),
      static_cast<long long>(u.wasted_slots), 100 * paged_waste, static_cast<long long>(contiguous_slots),
      static_cast<long long>(contiguous_slots - total_tokens), 100 * contiguous_waste,
      static_cast<double>(contiguous_slots) / static_cast<double>(u.allocated_slots));
  RecordProperty("paged_waste_percent", std::to_string(100 * paged_waste));
  RecordProperty("contiguous_waste_percent", std::to_string(100 * contiguous_waste));
  EXPECT_LE(paged_waste, 0.04);
  EXPECT_GT(contiguous_waste, 0.5);
}

}  // namespace
}  // namespace kvmesh::kv
