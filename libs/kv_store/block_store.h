// BlockStore: the cluster KV store's memory — a fixed pool of block slots, allocated up
// front, holding immutable, checksummed KV blocks keyed by StoreKey (store_key.h). The
// kvmesh.v1.KvStore service (libs/kv_store_server) is a thin gRPC layer over it.
//
// A slot's states:
//
//        PutIntent                Put (bytes written, checksum verified)
//   free ─────────▶ intent ──────────────────────────────────────────▶ committed
//     ▲               │  deadline passed / checksum mismatch               │
//     └───────────────┘                                                    │
//     └────────────────────────────────── evicted (LRU, no live lease) ◀───┘
//
//   1. PutIntent reserves a free slot (evicting the least recently used committed block
//      without a live lease when none is free) for each key the store does not hold and
//      nobody else is writing, and hands back a token. A key already committed is
//      reported present, never reserved twice.
//   2. Put copies the bytes into the reserved slot, outside the lock (the slot is
//      "writing": invisible, not expirable), then computes kv::Checksum over the slot and
//      commits only when it equals the writer's checksum and the intent's deadline has
//      not passed. Otherwise the slot is freed: nothing half-written is ever visible.
//   3. A committed block never changes; Put of a committed key succeeds only with the
//      same checksum and length (an identical re-put), else AlreadyExists.
//   4. Lookup returns the leading run of committed keys and grants one read lease, of
//      fixed length lease_ms, over it. A leased block is not evicted. Leases are never
//      extended; what bounds a hot block's protection is its pin window: from the moment
//      a block becomes leased, no lease may protect it past max_lease_ms later (a lookup
//      whose lease would end past the window leaves that block unprotected), and once the
//      window was cut short that way the block stays unprotected for lease_ms after its
//      last lease ends. A block looked up without pause is therefore evictable at least
//      lease_ms in every max_lease_ms + lease_ms (Mooncake #2187: reads that renew leases
//      forever starve eviction). An unprotected block is still served while it is there.
//   5. Read copies a committed block out (leased or not) with its checksum, holding a
//      reader count that keeps the slot from eviction only during the copy.
//   6. Expiry (leases, intents) happens lazily at the start of every call, at the time
//      each one was due, so an injected clock drives it deterministically.
//
// In place (the one-sided data plane, kv_store_server/kv_store_data_plane.h): a writer
// outside this process may write a reserved slot directly instead of Put copying it in.
//
//   intent ──LendIntents──▶ lent ──ReturnLent(landed)──▶ intent (landed) ──CommitInPlace──▶ committed
//                            │ ReturnLent(not landed)                     │ checksum mismatch,
//                            ▼                                             ▼ deadline passed
//                           free                                          free
//
//   A lent slot is neither expirable nor writable by Put: the data plane still may write
//   it, and only it knows when nothing can any more (ReturnLent). CommitInPlace
//   verifies the slot's bytes against the writer's checksum exactly as Put does, so a
//   block written in place is as whole as one put. A committed block read out in place
//   is held by BeginRead / EndRead (a reader count, as Read's) for as long as the data
//   plane reads it.
//
// The epoch is a random 64-bit value chosen at creation (options.epoch in tests): lease
// ids and intent tokens only mean something within it.
//
// Thread-safety: thread-safe. One mutex guards the slot table; block bytes are copied in
// and out without it, under the states above.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/huge_pages.h"
#include "kv_store/store_event_journal.h"
#include "kv_store/store_key.h"

namespace kvmesh::kv_store {

struct BlockStoreOptions {
  int64_t capacity_blocks = 0;          // slots, allocated up front
  int64_t slot_bytes = 0;               // the largest block a slot holds
  int64_t lease_ms = 5'000;             // a read lease's fixed length
  int64_t max_lease_ms = 30'000;        // longest a block stays leased in a row; >= lease_ms
  int64_t intent_timeout_ms = 10'000;   // an intent not put by then expires
  uint64_t epoch = 0;                   // 0: a random one
  int64_t journal_events = 1 << 16;     // residency changes kept for ReadEvents
  Clock* clock = nullptr;               // nullptr: Clock::Real(); must outlive the store
};

struct LeaseId {
  uint64_t value = 0;  // 0: none

  auto operator<=>(const LeaseId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const LeaseId& id) {
    return H::combine(std::move(h), id.value);
  }
};

struct LookupResult {
  int32_t num_present = 0;   // keys[0, num_present) are committed
  LeaseId lease;             // granted when num_present > 0
  absl::Time lease_expires;  // when the lease ends
};

enum class IntentOutcome : uint8_t {
  kReserved,  // put it with `token` before the deadline
  kPresent,   // committed already
  kBusy,      // another writer's intent holds it
  kNoSpace,   // no free slot and nothing evictable
};

struct BlockIntent {
  IntentOutcome outcome = IntentOutcome::kNoSpace;
  uint64_t token = 0;  // kReserved only
};

struct PutIntentResult {
  std::vector<BlockIntent> blocks;  // one per key, in order
  absl::Time deadline;              // of the reserved ones
};

struct BlockStoreStats {
  uint64_t epoch = 0;
  int64_t capacity_blocks = 0;
  int64_t slot_bytes = 0;
  int64_t num_blocks = 0;         // committed
  int64_t num_bytes = 0;          // committed bytes
  int64_t num_intents = 0;        // reserved or being written
  int64_t num_leases = 0;         // live
  int64_t num_leased_blocks = 0;  // protected by a live lease
  int64_t lookups = 0;
  int64_t queried_blocks = 0;
  int64_t hit_blocks = 0;
  int64_t get_blocks = 0;
  int64_t get_bytes = 0;
  int64_t put_blocks = 0;
  int64_t put_bytes = 0;
  int64_t evictions = 0;
  int64_t expired_intents = 0;
  int64_t checksum_failures = 0;
};

class BlockStore {
 public:
  // InvalidArgument for a capacity outside [1, 2^31), a slot size < 1, lease_ms or
  // intent_timeout_ms < 1, or max_lease_ms < lease_ms; ResourceExhausted when the pool
  // (capacity_blocks * slot_bytes, rounded up to huge pages) cannot be allocated.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Create(const BlockStoreOptions& options);

  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  uint64_t epoch() const { return epoch_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t capacity_blocks() const { return static_cast<int64_t>(capacity_); }
  absl::Duration lease_length() const { return lease_; }
  absl::Duration intent_timeout() const { return intent_timeout_; }

  // The leading run of `keys` (chain order) that is committed, with a read lease on it
  // (see the header). Never fails; num_present 0 grants no lease.
  LookupResult Lookup(std::span<const StoreKey> keys) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends `lease` now. False when it had ended already (expired, released) or never was.
  bool Release(LeaseId lease) ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves a slot for each key that is neither committed nor being written (see the
  // header). InvalidArgument when block_bytes is not in [1, slot_bytes()]; nothing is
  // reserved then. Otherwise OK, whatever each key's outcome.
  absl::StatusOr<PutIntentResult> PutIntent(std::span<const StoreKey> keys, int64_t block_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Writes and commits the block of `key` under its intent `token`. `checksum` is the
  // writer's kv::Checksum of `data`.
  //   OK: committed now, or committed already with these very bytes.
  //   AlreadyExists: committed already with other bytes (immutable).
  //   FailedPrecondition: no intent with this token (never reserved, expired, another
  //     writer's, or being written by another Put).
  //   InvalidArgument: data's size differs from the intent's block_bytes (the intent
  //     stays until its deadline).
  //   DataLoss: the bytes do not match `checksum`; an intent is dropped.
  //   DeadlineExceeded: the intent expired while its bytes were being written; dropped.
  absl::Status Put(const StoreKey& key, uint64_t token, std::span<const std::byte> data, uint64_t checksum)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `consume` with the committed bytes of `key` (no lock held; the slot cannot be
  // evicted meanwhile) and returns their checksum as committed. NotFound when `key` is
  // not committed.
  absl::StatusOr<uint64_t> Read(const StoreKey& key, absl::FunctionRef<void(std::span<const std::byte>)> consume)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The residency changes after `from`, at most `max_events` (>= 1) of them: the
  // journal's deltas, or, when the reader must start over (StoreEventsPage::reset) or
  // is in the middle of it, one page of a snapshot of the committed keys by slot order.
  // A snapshot's pages and the deltas after it agree however the store changed while
  // they were read: the deltas start where the journal stood when the snapshot began.
  StoreEventsPage ReadEvents(const StoreEventsCursor& from, size_t max_events) ABSL_LOCKS_EXCLUDED(mu_);

  // Counters and gauges as of now (expiring what is due first).
  BlockStoreStats Stats() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- In place (see the header) ----
  // The slots' memory: slot i at slot_memory() + i * stride_bytes(), capacity_blocks()
  // slots; what a data plane registers once.
  std::byte* slot_memory() const { return memory_.get(); }
  int64_t stride_bytes() const { return static_cast<int64_t>(stride_bytes_); }

  // Lends the slots of the open intents (keys[i], tokens[i]) to an in-place writer and
  // returns their slot indices, in order. FailedPrecondition, nothing lent, when one is
  // not an open, unlent intent with that token; InvalidArgument when the counts differ.
  absl::StatusOr<std::vector<int32_t>> LendIntents(std::span<const StoreKey> keys, std::span<const uint64_t> tokens)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The in-place writer is done with these lent slots: nothing writes into them any
  // more. kLanded: their bytes arrived (each still to be verified by CommitInPlace), and
  // they are intents again until their deadline; kUnused: nothing was written (the
  // lease was never granted), they are plain intents again (Put may still write them);
  // kFailed: they are freed.
  enum class LentOutcome : uint8_t { kLanded, kUnused, kFailed };
  void ReturnLent(std::span<const int32_t> slots, LentOutcome outcome) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the block written in place under intent `token`, after checking the slot's
  // bytes against `checksum` as Put does. A slot still lent is waited for up to `wait`.
  //   OK: committed now, or committed already with this checksum.
  //   FailedPrecondition: no landed intent with this token (never lent, its write
  //     failed, or still lent after `wait`).
  //   DataLoss / DeadlineExceeded: as Put's; the intent is dropped.
  absl::Status CommitInPlace(const StoreKey& key, uint64_t token, uint64_t checksum, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct PinnedBlock {
    int32_t slot = -1;
    int64_t length = 0;
    uint64_t checksum = 0;  // as committed
  };
  // Holds the committed block of `key` (its slot is not evicted) until EndRead(slot),
  // for a data plane that reads it out in place. NotFound when it is not committed.
  absl::StatusOr<PinnedBlock> BeginRead(const StoreKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  void EndRead(int32_t slot) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class SlotState : uint8_t { kFree, kIntent, kWriting, kCommitted, kLent };

  struct Slot {
    SlotState state = SlotState::kFree;
    StoreKey key;
    uint64_t token = 0;         // kIntent / kWriting
    absl::Time deadline;        // kIntent / kWriting
    int64_t length = 0;         // declared (intent) or committed bytes
    uint64_t checksum = 0;      // kCommitted
    int32_t pin_count = 0;      // live leases protecting it
    int32_t readers = 0;        // Read copies in flight
    absl::Time pinned_since;    // start of the current pin window
    absl::Time cooldown_until;  // not protected again before this
    bool window_cut = false;    // a lookup was refused protection in this window
    int32_t lru_prev = -1;      // committed, unpinned slots: the LRU list
    int32_t lru_next = -1;
    bool in_lru = false;
    bool landed = false;        // kIntent: written in place (ReturnLent(landed))
  };

  struct Lease {
    absl::Time expires;
    std::vector<int32_t> slots;  // the slots it protects
  };

  // A due time in a min-heap: a lease's end or an intent's deadline.
  struct Due {
    absl::Time at;
    uint64_t id = 0;     // lease id or intent token
    int32_t slot = -1;   // intents only
    bool operator>(const Due& other) const { return at > other.at; }
  };

  BlockStore(const BlockStoreOptions& options, uint64_t epoch, HugePageMemory memory);

  std::byte* SlotData(int32_t slot) { return memory_.get() + static_cast<size_t>(slot) * stride_bytes_; }

  // Put of a key that is committed already: OK when `data` matches its checksum and the
  // committed block; DataLoss when it does not match its checksum; else AlreadyExists.
  absl::Status PutOfCommitted(const StoreKey& key, bool same_as_committed, std::span<const std::byte> data,
                              uint64_t checksum) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits a kWriting slot whose bytes hash to `written`, or frees it (DataLoss,
  // DeadlineExceeded): the end of Put and CommitInPlace.
  absl::Status FinishWriteLocked(int32_t slot, const StoreKey& key, uint64_t written, uint64_t checksum)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every lease and intent due by `now`, each at its own due time.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot, evicting the LRU evictable block if needed; -1 when there is none.
  int32_t TakeSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns `slot` to the free list (its key leaves the map).
  void FreeSlotLocked(int32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Protects `slot` by a lease ending at `lease_end` if its window allows (header, 4).
  bool TryPinLocked(int32_t slot, absl::Time now, absl::Time lease_end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one protection of `slot`, ended at `at`.
  void UnpinLocked(int32_t slot, absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLeaseLocked(uint64_t id, absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LRU list of committed, unpinned slots: most recent at the head.
  void LruPushFrontLocked(int32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruRemoveLocked(int32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(int32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t epoch_;
  const int32_t capacity_;
  const int64_t slot_bytes_;
  const size_t stride_bytes_;  // slot_bytes rounded up to 64
  const absl::Duration lease_;
  const absl::Duration max_lease_;
  const absl::Duration intent_timeout_;
  Clock& clock_;
  const HugePageMemory memory_;

  mutable absl::Mutex mu_;
  absl::CondVar returned_;  // signalled by ReturnLent
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StoreKey, int32_t> index_ ABSL_GUARDED_BY(mu_);  // intent, writing or committed
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  std::vector<Due> lease_due_ ABSL_GUARDED_BY(mu_);   // min-heap; stale entries skipped
  std::vector<Due> intent_due_ ABSL_GUARDED_BY(mu_);  // min-heap; stale entries skipped
  int32_t lru_head_ ABSL_GUARDED_BY(mu_) = -1;
  int32_t lru_tail_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t num_intents_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_leased_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  BlockStoreStats counters_ ABSL_GUARDED_BY(mu_);  // the running totals (and num_blocks, num_bytes)
  StoreEventJournal journal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmesh::kv_store
