#include "kv_store/block_store.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/clock.h"
#include "kv/checksum.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kSlotBytes = 256;
constexpr int64_t kLeaseMs = 1000;
constexpr int64_t kMaxLeaseMs = 3000;
constexpr int64_t kIntentMs = 500;

StoreKey Key(uint64_t n) { return StoreKey{.low = n, .high = n * 7 + 1}; }

std::vector<std::byte> Bytes(uint64_t seed, int64_t size = kSlotBytes) {
  std::vector<std::byte> b(static_cast<size_t>(size));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((seed * 131 + i * 7) & 0xff);
  return b;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Make(int64_t capacity) {
    return BlockStore::Create({.capacity_blocks = capacity,
                               .slot_bytes = kSlotBytes,
                               .lease_ms = kLeaseMs,
                               .max_lease_ms = kMaxLeaseMs,
                               .intent_timeout_ms = kIntentMs,
                               .epoch = 42,
                               .clock = &clock_})
        .value();
  }

  // PutIntent + Put of one block; the Put's status.
  static absl::Status PutOne(BlockStore& store, const StoreKey& key, const std::vector<std::byte>& data) {
    absl::StatusOr<PutIntentResult> intent = store.PutIntent({{key}}, static_cast<int64_t>(data.size()));
    if (!intent.ok()) return intent.status();
    if (intent->blocks[0].outcome != IntentOutcome::kReserved) return absl::ResourceExhaustedError("not reserved");
    return store.Put(key, intent->blocks[0].token, data, kv::Checksum(data));
  }

  static std::vector<std::byte> ReadAll(BlockStore& store, const StoreKey& key, uint64_t* checksum = nullptr) {
    std::vector<std::byte> out;
    absl::StatusOr<uint64_t> c =
        store.Read(key, [&](std::span<const std::byte> bytes) { out.assign(bytes.begin(), bytes.end()); });
    EXPECT_TRUE(c.ok()) << c.status();
    if (checksum != nullptr && c.ok()) *checksum = *c;
    return out;
  }

  ManualClock clock_;
};

TEST_F(BlockStoreTest, CreateRefusesBadOptions) {
  EXPECT_EQ(BlockStore::Create({.capacity_blocks = 0, .slot_bytes = 64}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockStore::Create({.capacity_blocks = 4, .slot_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockStore::Create({.capacity_blocks = 4, .slot_bytes = 64, .lease_ms = 100, .max_lease_ms = 50})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockStore::Create({.capacity_blocks = int64_t{1} << 40, .slot_bytes = 64}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, EpochIsRandomAndNonZeroUnlessFixed) {
  auto a = BlockStore::Create({.capacity_blocks = 1, .slot_bytes = 64}).value();
  auto b = BlockStore::Create({.capacity_blocks = 1, .slot_bytes = 64}).value();
  EXPECT_NE(a->epoch(), 0u);
  EXPECT_NE(a->epoch(), b->epoch());
  EXPECT_EQ(Make(1)->epoch(), 42u);
}

TEST_F(BlockStoreTest, PutThenReadReturnsTheSameBytesAndChecksum) {
  auto store = Make(4);
  const std::vector<std::byte> data = Bytes(1, 100);  // smaller than a slot: its length is kept
  ASSERT_TRUE(PutOne(*store, Key(1), data).ok());
  uint64_t checksum = 0;
  EXPECT_EQ(ReadAll(*store, Key(1), &checksum), data);
  EXPECT_EQ(checksum, kv::Checksum(data));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.num_blocks, 1);
  EXPECT_EQ(s.num_bytes, 100);
  EXPECT_EQ(s.put_blocks, 1);
  EXPECT_EQ(s.get_bytes, 100);
}

TEST_F(BlockStoreTest, LookupReturnsTheLeadingRunOnly) {
  auto store = Make(8);
  for (uint64_t k : {1, 2, 4}) ASSERT_TRUE(PutOne(*store, Key(k), Bytes(k)).ok());
  const std::vector<StoreKey> chain = {Key(1), Key(2), Key(3), Key(4)};
  LookupResult r = store->Lookup(chain);
  EXPECT_EQ(r.num_present, 2);  // Key(4) is present but past the miss
  EXPECT_NE(r.lease.value, 0u);
  EXPECT_EQ(r.lease_expires, clock_.Now() + absl::Milliseconds(kLeaseMs));
  EXPECT_EQ(store->Lookup({{Key(3)}}).num_present, 0);
  EXPECT_EQ(store->Lookup({{Key(3)}}).lease.value, 0u);  // nothing present, no lease
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.lookups, 3);
  EXPECT_EQ(s.queried_blocks, 6);
  EXPECT_EQ(s.hit_blocks, 2);
}

TEST_F(BlockStoreTest, ACommittedBlockIsImmutable) {
  auto store = Make(4);
  const std::vector<std::byte> data = Bytes(1);
  ASSERT_TRUE(PutOne(*store, Key(1), data).ok());
  // A second intent on a committed key reports it present and reserves nothing.
  PutIntentResult again = store->PutIntent({{Key(1)}}, kSlotBytes).value();
  EXPECT_EQ(again.blocks[0].outcome, IntentOutcome::kPresent);
  EXPECT_EQ(store->Stats().num_intents, 0);
  // A put with other bytes is refused (whatever token it carries); identical bytes are a no-op.
  const std::vector<std::byte> other = Bytes(2);
  EXPECT_EQ(store->Put(Key(1), 1, other, kv::Checksum(other)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store->Put(Key(1), 1, data, kv::Checksum(data)).ok());
  EXPECT_EQ(ReadAll(*store, Key(1)), data);
  EXPECT_EQ(store->Stats().put_blocks, 1);
}

TEST_F(BlockStoreTest, ChecksumMismatchIsRefusedAndNothingBecomesVisible) {
  auto store = Make(1);
  const std::vector<std::byte> data = Bytes(3);
  PutIntentResult intent = store->PutIntent({{Key(1)}}, kSlotBytes).value();
  ASSERT_EQ(intent.blocks[0].outcome, IntentOutcome::kReserved);
  EXPECT_EQ(store->Put(Key(1), intent.blocks[0].token, data, kv::Checksum(data) ^ 1).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 0);
  EXPECT_EQ(store->Read(Key(1), [](std::span<const std::byte>) {}).status().code(), absl::StatusCode::kNotFound);
  BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.checksum_failures, 1);
  EXPECT_EQ(s.num_intents, 0);
  EXPECT_EQ(s.num_blocks, 0);
  // The slot went back to the pool: the one-slot store takes a new intent at once.
  EXPECT_TRUE(PutOne(*store, Key(1), data).ok());
}

TEST_F(BlockStoreTest, PutWithoutAValidIntentIsRefused) {
  auto store = Make(2);
  const std::vector<std::byte> data = Bytes(4);
  EXPECT_EQ(store->Put(Key(1), 7, data, kv::Checksum(data)).code(), absl::StatusCode::kFailedPrecondition);
  PutIntentResult intent = store->PutIntent({{Key(1)}}, kSlotBytes).value();
  const uint64_t token = intent.blocks[0].token;
  EXPECT_EQ(store->Put(Key(1), token + 1, data, kv::Checksum(data)).code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<std::byte> short_data = Bytes(4, kSlotBytes - 1);
  EXPECT_EQ(store->Put(Key(1), token, short_data, kv::Checksum(short_data)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Put(Key(1), token, data, kv::Checksum(data)).ok());  // the intent survived both
}

TEST_F(BlockStoreTest, PutIntentRefusesABlockLargerThanASlot) {
  auto store = Make(2);
  EXPECT_EQ(store->PutIntent({{Key(1)}}, kSlotBytes + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutIntent({{Key(1)}}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Stats().num_intents, 0);
}

TEST_F(BlockStoreTest, ASecondWriterOfTheSameKeyIsToldBusy) {
  auto store = Make(4);
  PutIntentResult first = store->PutIntent({{Key(1)}}, kSlotBytes).value();
  PutIntentResult second = store->PutIntent({{Key(1), Key(2)}}, kSlotBytes).value();
  EXPECT_EQ(first.blocks[0].outcome, IntentOutcome::kReserved);
  EXPECT_EQ(second.blocks[0].outcome, IntentOutcome::kBusy);
  EXPECT_EQ(second.blocks[1].outcome, IntentOutcome::kReserved);
}

TEST_F(BlockStoreTest, AnIntentNotCommittedBeforeItsDeadlineExpiresAndItsSpaceReturns) {
  auto store = Make(1);
  PutIntentResult intent = store->PutIntent({{Key(1)}}, kSlotBytes).value();
  ASSERT_EQ(intent.blocks[0].outcome, IntentOutcome::kReserved);
  EXPECT_EQ(intent.deadline, clock_.Now() + absl::Milliseconds(kIntentMs));
  // The only slot is reserved: another key finds no space.
  EXPECT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kNoSpace);
  clock_.Advance(absl::Milliseconds(kIntentMs + 1));
  EXPECT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kReserved);
  const std::vector<std::byte> data = Bytes(5);
  EXPECT_EQ(store->Put(Key(1), intent.blocks[0].token, data, kv::Checksum(data)).code(),
            absl::StatusCode::kFailedPrecondition);
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.expired_intents, 1);
  EXPECT_EQ(s.num_intents, 1);
  EXPECT_EQ(s.num_blocks, 0);
}

TEST_F(BlockStoreTest, EvictionTakesTheLeastRecentlyUsedUnleasedBlock) {
  auto store = Make(2);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  ASSERT_TRUE(PutOne(*store, Key(2), Bytes(2)).ok());
  ASSERT_TRUE(store->Release(store->Lookup({{Key(1)}}).lease));  // Key(1) used last; Key(2) is the LRU
  ASSERT_TRUE(PutOne(*store, Key(3), Bytes(3)).ok());
  EXPECT_EQ(store->Lookup({{Key(2)}}).num_present, 0);
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 1);
  EXPECT_EQ(store->Stats().evictions, 1);
}

TEST_F(BlockStoreTest, EvictionTakesAChainsTailBeforeItsHead) {
  auto store = Make(4);
  for (const int k : {3, 2, 1}) ASSERT_TRUE(PutOne(*store, Key(k), Bytes(k)).ok());  // as a client puts a chain
  ASSERT_TRUE(store->Release(store->Lookup({{Key(1), Key(2), Key(3)}}).lease));
  ASSERT_TRUE(PutOne(*store, Key(9), Bytes(9)).ok());
  ASSERT_TRUE(PutOne(*store, Key(10), Bytes(10)).ok());  // full: one block of the chain goes
  EXPECT_EQ(store->Lookup({{Key(1), Key(2), Key(3)}}).num_present, 2) << "the tail went, the leading run stays";
}

TEST_F(BlockStoreTest, EvictionSkipsLeasedBlocksUntilTheLeaseEnds) {
  auto store = Make(2);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  ASSERT_TRUE(PutOne(*store, Key(2), Bytes(2)).ok());
  const LookupResult lease = store->Lookup({{Key(1), Key(2)}});
  ASSERT_EQ(lease.num_present, 2);
  EXPECT_EQ(store->Stats().num_leased_blocks, 2);
  EXPECT_EQ(store->PutIntent({{Key(3)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kNoSpace);
  // Released: evictable again.
  EXPECT_TRUE(store->Release(lease.lease));
  EXPECT_FALSE(store->Release(lease.lease));
  EXPECT_EQ(store->PutIntent({{Key(3)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kReserved);
  // Expired: evictable again too. (Key(3)'s intent evicted the chain's tail, Key(2).)
  const LookupResult second = store->Lookup({{Key(1)}});
  ASSERT_EQ(second.num_present, 1);
  EXPECT_EQ(store->PutIntent({{Key(4)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kNoSpace);
  clock_.Advance(absl::Milliseconds(kLeaseMs));
  EXPECT_EQ(store->PutIntent({{Key(4)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kReserved);
  EXPECT_FALSE(store->Release(second.lease));  // it had ended
  EXPECT_EQ(store->Stats().num_leases, 0);
}

// Mooncake #2187: a block looked up without pause must still become evictable. Lookups
// every lease_ms / 2 keep one block leased; its protection ends max_lease_ms after it
// began, and then it stays unprotected for lease_ms, whatever the lookups do.
TEST_F(BlockStoreTest, RepeatedLookupsCannotProtectABlockPastTheMaxLease) {
  auto store = Make(1);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  const absl::Time start = clock_.Now();
  const absl::Duration step = absl::Milliseconds(kLeaseMs / 2);
  // Protected while leases within the window keep coming.
  while (clock_.Now() + absl::Milliseconds(kLeaseMs) <= start + absl::Milliseconds(kMaxLeaseMs)) {
    ASSERT_EQ(store->Lookup({{Key(1)}}).num_present, 1);
    ASSERT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kNoSpace)
        << "evicted at " << (clock_.Now() - start);
    clock_.Advance(step);
  }
  // Past the window, lookups still find it but no longer protect it...
  while (clock_.Now() < start + absl::Milliseconds(kMaxLeaseMs)) {
    EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 1);
    clock_.Advance(step);
  }
  EXPECT_EQ(store->Stats().num_leased_blocks, 0);
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 1);  // a lookup right at the end: still unprotected
  EXPECT_EQ(store->Stats().num_leased_blocks, 0);
  // ...so a put can take its slot.
  EXPECT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes).value().blocks[0].outcome, IntentOutcome::kReserved);
  EXPECT_EQ(store->Stats().evictions, 1);
}

TEST_F(BlockStoreTest, AfterItsCooldownAHotBlockIsProtectedAgain) {
  auto store = Make(1);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  const absl::Duration step = absl::Milliseconds(kLeaseMs / 2);
  for (absl::Time end = clock_.Now() + absl::Milliseconds(kMaxLeaseMs); clock_.Now() < end; clock_.Advance(step)) {
    store->Lookup({{Key(1)}});
  }
  EXPECT_EQ(store->Stats().num_leased_blocks, 0);
  clock_.Advance(absl::Milliseconds(kLeaseMs));  // the cooldown
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 1);
  EXPECT_EQ(store->Stats().num_leased_blocks, 1);
}

TEST_F(BlockStoreTest, LeasesHaveAFixedLengthThatLookupsDoNotExtend) {
  auto store = Make(2);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  const LookupResult first = store->Lookup({{Key(1)}});
  clock_.Advance(absl::Milliseconds(kLeaseMs - 1));
  ASSERT_TRUE(store->Read(Key(1), [](std::span<const std::byte>) {}).ok());  // reads renew nothing
  const LookupResult second = store->Lookup({{Key(1)}});
  EXPECT_EQ(second.lease_expires - first.lease_expires, absl::Milliseconds(kLeaseMs - 1));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(store->Release(first.lease));  // ended at its own time
  EXPECT_TRUE(store->Release(second.lease));
}

TEST_F(BlockStoreTest, SaltIsolationHoldsThroughKeys) {
  // The store holds opaque keys: a tenant whose cache_salt differs derives other keys
  // (store_key_test.cc) and finds nothing of another tenant's.
  auto store = Make(4);
  const kv::KvBlockSpec spec{.num_layers = 2, .num_kv_heads = 1, .head_dim = 4, .block_size_tokens = 16,
                             .block_bytes = 512};
  const StoreKeyScope tenant_a{.model = "m", .block_spec = spec, .cache_salt = "tenant-a"};
  const StoreKeyScope tenant_b{.model = "m", .block_spec = spec, .cache_salt = "tenant-b"};
  const kv::BlockHash block{.low = 11, .high = 12};
  ASSERT_TRUE(PutOne(*store, DeriveStoreKey(block, tenant_a), Bytes(1)).ok());
  EXPECT_EQ(store->Lookup({{DeriveStoreKey(block, tenant_a)}}).num_present, 1);
  EXPECT_EQ(store->Lookup({{DeriveStoreKey(block, tenant_b)}}).num_present, 0);
}

// ---- In place (the UCX data plane) ----

// Reserves `key` and lends its slot; the slot index.
int32_t LendOne(BlockStore& store, const StoreKey& key, uint64_t* token) {
  absl::StatusOr<PutIntentResult> intent = store.PutIntent({{key}}, kSlotBytes);
  EXPECT_TRUE(intent.ok());
  *token = intent->blocks[0].token;
  const uint64_t tokens[] = {*token};
  absl::StatusOr<std::vector<int32_t>> slots = store.LendIntents({{key}}, tokens);
  EXPECT_TRUE(slots.ok()) << slots.status();
  return slots.ok() ? (*slots)[0] : -1;
}

TEST_F(BlockStoreTest, ABlockWrittenInPlaceIsCommittedOnlyAfterItsBytesVerify) {
  auto store = Make(4);
  uint64_t token = 0;
  const int32_t slot = LendOne(*store, Key(1), &token);
  const std::vector<std::byte> data = Bytes(1);
  std::memcpy(store->slot_memory() + slot * store->stride_bytes(), data.data(), data.size());
  // Lent: neither Put nor expiry touches it.
  EXPECT_EQ(store->Put(Key(1), token, data, kv::Checksum(data)).code(), absl::StatusCode::kFailedPrecondition);
  const int32_t slots[] = {slot};
  store->ReturnLent(slots, BlockStore::LentOutcome::kLanded);
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 0);
  EXPECT_TRUE(store->CommitInPlace(Key(1), token, kv::Checksum(data), absl::ZeroDuration()).ok());
  EXPECT_EQ(ReadAll(*store, Key(1)), data);
}

TEST_F(BlockStoreTest, AnInPlaceBlockWhoseBytesDoNotMatchIsDroppedNotCommitted) {
  auto store = Make(4);
  uint64_t token = 0;
  const int32_t slot = LendOne(*store, Key(1), &token);
  const int32_t slots[] = {slot};
  store->ReturnLent(slots, BlockStore::LentOutcome::kLanded);
  EXPECT_EQ(store->CommitInPlace(Key(1), token, 12345, absl::ZeroDuration()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->Lookup({{Key(1)}}).num_present, 0);
  EXPECT_EQ(store->Stats().num_intents, 0);
  EXPECT_EQ(store->Stats().checksum_failures, 1);
}

TEST_F(BlockStoreTest, AFailedInPlaceWriteFreesItsSlotAndCannotBeCommitted) {
  auto store = Make(1);
  uint64_t token = 0;
  const int32_t slot = LendOne(*store, Key(1), &token);
  const int32_t slots[] = {slot};
  store->ReturnLent(slots, BlockStore::LentOutcome::kFailed);
  EXPECT_EQ(store->CommitInPlace(Key(1), token, 0, absl::ZeroDuration()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Stats().num_intents, 0);
  EXPECT_TRUE(PutOne(*store, Key(2), Bytes(2)).ok());  // the slot is free again
}

TEST_F(BlockStoreTest, ALentSlotOutlivesItsDeadlineButALandedOneExpiresAtIt) {
  auto store = Make(1);
  uint64_t token = 0;
  const int32_t slot = LendOne(*store, Key(1), &token);
  clock_.Advance(absl::Milliseconds(kIntentMs * 2));
  EXPECT_EQ(store->Stats().num_intents, 1);  // lent: the data plane may still write it
  const int32_t slots[] = {slot};
  store->ReturnLent(slots, BlockStore::LentOutcome::kLanded);  // past its deadline: dropped
  EXPECT_EQ(store->Stats().num_intents, 0);
  uint64_t token2 = 0;
  const int32_t slot2 = LendOne(*store, Key(2), &token2);
  const int32_t slots2[] = {slot2};
  store->ReturnLent(slots2, BlockStore::LentOutcome::kLanded);
  clock_.Advance(absl::Milliseconds(kIntentMs + 1));
  EXPECT_EQ(store->Stats().num_intents, 0);  // landed, never committed: expired
}

TEST_F(BlockStoreTest, LendIntentsRefusesAWrongTokenAndLendsNothing) {
  auto store = Make(4);
  absl::StatusOr<PutIntentResult> intent = store->PutIntent({{Key(1), Key(2)}}, kSlotBytes);
  ASSERT_TRUE(intent.ok());
  const uint64_t tokens[] = {intent->blocks[0].token, intent->blocks[1].token + 1};
  EXPECT_EQ(store->LendIntents({{Key(1), Key(2)}}, tokens).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<std::byte> data = Bytes(1);
  EXPECT_TRUE(store->Put(Key(1), intent->blocks[0].token, data, kv::Checksum(data)).ok());  // not lent
}

TEST_F(BlockStoreTest, BeginReadHoldsABlockAgainstEviction) {
  auto store = Make(1);
  ASSERT_TRUE(PutOne(*store, Key(1), Bytes(1)).ok());
  absl::StatusOr<BlockStore::PinnedBlock> pinned = store->BeginRead(Key(1));
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(pinned->checksum, kv::Checksum(Bytes(1)));
  EXPECT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes)->blocks[0].outcome, IntentOutcome::kNoSpace);
  store->EndRead(pinned->slot);
  EXPECT_EQ(store->PutIntent({{Key(2)}}, kSlotBytes)->blocks[0].outcome, IntentOutcome::kReserved);
}

}  // namespace
}  // namespace kvmesh::kv_store
