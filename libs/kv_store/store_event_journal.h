// StoreEventJournal: the kv-store's recent residency changes (a block committed, a block
// evicted), numbered 1, 2, 3, ... within the store's epoch, for readers that mirror what
// the store holds (the scheduler's prefix index: KvStore.Events). Bounded: a reader that
// fell behind the oldest retained change must start over from a snapshot of every
// committed key, which BlockStore::ReadEvents pages through.
//
// Thread-safety: not thread-safe; BlockStore owns it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "kv_store/store_key.h"

namespace kvmesh::kv_store {

struct StoreEvent {
  uint64_t sequence = 0;
  StoreKey key;
  bool removed = false;  // false: committed

  bool operator==(const StoreEvent&) const = default;
};

// Where a reader mirroring the store's residency stands (BlockStore::ReadEvents, KvStore.Events).
struct StoreEventsCursor {
  uint64_t epoch = 0;           // of what it mirrors; 0: nothing yet
  uint64_t after = 0;           // the last change it applied
  int64_t snapshot_cursor = 0;  // > 0: the slot its snapshot continues at
};

struct StoreEventsPage {
  uint64_t epoch = 0;
  // The reader must forget what it mirrors of this store, then apply `events`: it
  // followed another epoch (the store restarted, empty) or fell behind the journal.
  // `events` then begins a snapshot of the committed keys.
  bool reset = false;
  std::vector<StoreEvent> events;  // in order; a snapshot's are all stores, sequence 0
  StoreEventsCursor next;          // where the reader stands after applying them
};

class StoreEventJournal {
 public:
  // Keeps the last `capacity` changes (at least 1).
  explicit StoreEventJournal(size_t capacity);

  void Stored(const StoreKey& key) { Append(key, /*removed=*/false); }
  void Removed(const StoreKey& key) { Append(key, /*removed=*/true); }

  // The sequence of the newest change; 0 before the first.
  uint64_t last_sequence() const { return next_sequence_ - 1; }
  // Whether every change after `after` is still retained (a reader at `after` can
  // catch up from deltas). False for an `after` newer than the newest change: it came
  // from another epoch.
  bool Covers(uint64_t after) const;
  // Up to `max` changes after `after`, oldest first. Requires Covers(after).
  std::vector<StoreEvent> After(uint64_t after, size_t max) const;

 private:
  void Append(const StoreKey& key, bool removed);

  const size_t capacity_;
  std::deque<StoreEvent> events_;  // consecutive sequences, oldest first
  uint64_t next_sequence_ = 1;
};

}  // namespace kvmesh::kv_store
