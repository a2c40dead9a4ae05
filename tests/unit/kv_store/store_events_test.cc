// BlockStore::ReadEvents and its journal: a mirror that follows the pages it returns
// holds exactly the committed keys, whatever happened between its calls.
#include <algorithm>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "core/clock.h"
#include "kv/checksum.h"
#include "kv_store/block_store.h"
#include "kv_store/store_event_journal.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kSlotBytes = 64;

StoreKey Key(uint64_t n) { return StoreKey{.low = n, .high = ~n}; }

// What a reader builds from the pages it reads: StoreResidency's rule, kept minimal.
struct Mirror {
  StoreEventsCursor cursor;
  absl::flat_hash_set<StoreKey> keys;
  int resets = 0;

  // Reads until nothing more is pending.
  void CatchUp(BlockStore& store, size_t page_size) {
    for (int guard = 0; guard < 1000; ++guard) {
      const StoreEventsPage page = store.ReadEvents(cursor, page_size);
      if (page.reset) {
        keys.clear();
        ++resets;
      }
      for (const StoreEvent& e : page.events) {
        if (e.removed) {
          keys.erase(e.key);
        } else {
          keys.insert(e.key);
        }
      }
      cursor = page.next;
      if (page.next.snapshot_cursor == 0 && page.events.size() < page_size) return;
    }
    FAIL() << "the events never ended";
  }
};

class StoreEventsTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Make(int64_t capacity, int64_t journal, uint64_t epoch = 7) {
    return BlockStore::Create({.capacity_blocks = capacity,
                               .slot_bytes = kSlotBytes,
                               .epoch = epoch,
                               .journal_events = journal,
                               .clock = &clock_})
        .value();
  }
  static void Put(BlockStore& store, uint64_t n) {
    const std::vector<std::byte> data(kSlotBytes, static_cast<std::byte>(n));
    absl::StatusOr<PutIntentResult> intent = store.PutIntent({{Key(n)}}, kSlotBytes);
    ASSERT_TRUE(intent.ok()) << intent.status();
    ASSERT_EQ(intent->blocks[0].outcome, IntentOutcome::kReserved);
    ASSERT_TRUE(store.Put(Key(n), intent->blocks[0].token, data, kv::Checksum(data)).ok());
  }
  // The keys a Lookup of each finds committed.
  static absl::flat_hash_set<StoreKey> Committed(BlockStore& store, uint64_t up_to) {
    absl::flat_hash_set<StoreKey> out;
    for (uint64_t n = 0; n <= up_to; ++n) {
      const StoreKey k = Key(n);
      LookupResult r = store.Lookup({&k, 1});
      if (r.num_present == 1) {
        out.insert(k);
        store.Release(r.lease);
      }
    }
    return out;
  }

  ManualClock clock_;
};

TEST(StoreEventJournalTest, KeepsTheLastChangesAndSaysWhenAReaderFellBehind) {
  StoreEventJournal journal(2);
  EXPECT_TRUE(journal.Covers(0));
  journal.Stored(Key(1));
  journal.Stored(Key(2));
  EXPECT_TRUE(journal.Covers(0));
  journal.Removed(Key(1));  // sequence 3; sequence 1 is dropped
  EXPECT_EQ(journal.last_sequence(), 3u);
  EXPECT_FALSE(journal.Covers(0)) << "change 1 is gone: a reader at 0 must start over";
  EXPECT_TRUE(journal.Covers(1));
  EXPECT_FALSE(journal.Covers(4)) << "a cursor past the newest change came from another epoch";
  const std::vector<StoreEvent> after = journal.After(1, 10);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0], (StoreEvent{.sequence = 2, .key = Key(2), .removed = false}));
  EXPECT_EQ(after[1], (StoreEvent{.sequence = 3, .key = Key(1), .removed = true}));
  EXPECT_EQ(journal.After(1, 1).size(), 1u);
  EXPECT_TRUE(journal.After(3, 10).empty());
}

TEST_F(StoreEventsTest, ANewReaderGetsASnapshotThenDeltasIncludingEvictions) {
  std::unique_ptr<BlockStore> store = Make(/*capacity=*/3, /*journal=*/100);
  for (uint64_t n : {1, 2, 3}) Put(*store, n);
  Mirror mirror;
  mirror.CatchUp(*store, 16);
  EXPECT_EQ(mirror.resets, 1);
  EXPECT_EQ(mirror.keys, Committed(*store, 10));
  EXPECT_EQ(mirror.cursor.epoch, 7u);
  Put(*store, 4);  // evicts the least recently used (key 1)
  mirror.CatchUp(*store, 16);
  EXPECT_EQ(mirror.resets, 1) << "deltas, not another snapshot";
  EXPECT_EQ(mirror.keys, Committed(*store, 10));
  EXPECT_FALSE(mirror.keys.contains(Key(1)));
  EXPECT_TRUE(mirror.keys.contains(Key(4)));
}

TEST_F(StoreEventsTest, AReaderBehindTheJournalStartsOverFromASnapshot) {
  std::unique_ptr<BlockStore> store = Make(/*capacity=*/4, /*journal=*/2);
  Put(*store, 1);
  Mirror mirror;
  mirror.CatchUp(*store, 16);
  for (uint64_t n = 2; n <= 9; ++n) Put(*store, n);  // 8 commits and 4 evictions: past the journal
  mirror.CatchUp(*store, 16);
  EXPECT_EQ(mirror.resets, 2);
  EXPECT_EQ(mirror.keys, Committed(*store, 10));
}

TEST_F(StoreEventsTest, AReaderOfAnotherEpochStartsOverEvenWithACursorThatLooksCurrent) {
  std::unique_ptr<BlockStore> first = Make(/*capacity=*/4, /*journal=*/100, /*epoch=*/7);
  for (uint64_t n : {1, 2}) Put(*first, n);
  Mirror mirror;
  mirror.CatchUp(*first, 16);
  // The store restarts (a new epoch) and commits as many changes as before, other keys.
  std::unique_ptr<BlockStore> second = Make(/*capacity=*/4, /*journal=*/100, /*epoch=*/8);
  for (uint64_t n : {5, 6}) Put(*second, n);
  const StoreEventsPage page = second->ReadEvents(mirror.cursor, 16);
  EXPECT_TRUE(page.reset) << "sequence 2 of epoch 7 is not sequence 2 of epoch 8";
  mirror.CatchUp(*second, 16);
  EXPECT_EQ(mirror.keys, Committed(*second, 10));
  EXPECT_FALSE(mirror.keys.contains(Key(1)));
}

TEST_F(StoreEventsTest, ASnapshotReadInPagesWhileTheStoreChangesEndsExact) {
  std::unique_ptr<BlockStore> store = Make(/*capacity=*/8, /*journal=*/1000);
  for (uint64_t n = 1; n <= 8; ++n) Put(*store, n);
  Mirror mirror;
  // Page by page, one key each, with commits (and so evictions) between the pages.
  uint64_t next = 9;
  for (int page = 0; page < 20; ++page) {
    const StoreEventsPage p = store->ReadEvents(mirror.cursor, 1);
    if (p.reset) mirror.keys.clear();
    for (const StoreEvent& e : p.events) {
      if (e.removed) {
        mirror.keys.erase(e.key);
      } else {
        mirror.keys.insert(e.key);
      }
    }
    mirror.cursor = p.next;
    if (page < 6) Put(*store, next++);
  }
  mirror.CatchUp(*store, 1);
  EXPECT_EQ(mirror.keys, Committed(*store, next));
}

TEST_F(StoreEventsTest, AskingForNoEventsStillMakesProgress) {
  std::unique_ptr<BlockStore> store = Make(/*capacity=*/2, /*journal=*/10);
  Put(*store, 1);
  const StoreEventsPage page = store->ReadEvents({}, 0);
  EXPECT_EQ(page.events.size(), 1u) << "a page holds at least one event";
}

}  // namespace
}  // namespace kvmesh::kv_store
