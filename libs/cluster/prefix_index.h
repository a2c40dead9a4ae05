// GlobalPrefixIndex: which workers hold which KV blocks, on which tier, built from the
// workers' KV events. It answers "for each worker, how many of this prompt's leading
// blocks does it hold", the input of cache-aware placement.
//
// Hashes are chained (kv/block_hash.h), so a block's hash names its whole prefix and a
// prompt's i-th block hash can only be held by a worker that computed the same first
// i blocks. A worker can reuse only a *leading* run: matching stops at the first block
// a worker lacks, even if it holds later ones (e.g. after an out-of-order eviction).
//
// A block may sit on several tiers of one worker (written back to host while still on
// device); each (worker, block, tier) is tracked, and a match counts a block at the
// best tier the worker holds it on. Events are idempotent: storing a held block or
// removing an absent one changes nothing.
//
// Memory: one hash-map entry per distinct hash plus one set entry per (worker, hash).
//
// Thread-safety: not thread-safe; owned by WorkerRegistry under its lock.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "kv/kv_types.h"

namespace kvmesh::cluster {

inline constexpr int kNumTiers = 4;

// How much of a prompt's leading blocks one worker holds.
struct PrefixMatch {
  int32_t num_blocks = 0;  // length of the leading run held on any tier (or in flight)
  // The run's blocks by the best (lowest-numbered) tier each is held on, indexed by
  // kv::Tier: [device, host, disk, store]. Sums to num_blocks - num_blocks_in_flight.
  std::array<int32_t, kNumTiers> num_blocks_by_tier{};
  // The run's tail that a request just placed on the worker is computing and the worker
  // has not reported yet (WorkerRegistry's InFlightPrefixes; the index itself leaves it 0).
  int32_t num_blocks_in_flight = 0;

  bool operator==(const PrefixMatch&) const = default;
};

class GlobalPrefixIndex {
 public:
  GlobalPrefixIndex() = default;
  GlobalPrefixIndex(const GlobalPrefixIndex&) = delete;
  GlobalPrefixIndex& operator=(const GlobalPrefixIndex&) = delete;

  // Applies one worker's events, in order.
  void Apply(std::string_view worker_id, std::span<const kv::KvEvent> events);
  // Forgets everything about the worker (it left, expired, restarted or sent a snapshot).
  void RemoveWorker(std::string_view worker_id);

  // For every worker holding at least the first block of `prompt_hashes` (the prompt's
  // chained full-block hashes, first block first), its leading match. Workers holding
  // nothing of it are absent. Cost: O(sum of the matches' lengths).
  absl::flat_hash_map<std::string, PrefixMatch> Match(std::span<const kv::BlockHash> prompt_hashes) const;
  // One worker's leading match (zero when it holds nothing).
  PrefixMatch MatchWorker(std::span<const kv::BlockHash> prompt_hashes, std::string_view worker_id) const;

  // Distinct block hashes held by the worker on any tier.
  int64_t num_blocks(std::string_view worker_id) const;
  // Up to `max_blocks` of the worker's (block, tier) entries as kStored events (block
  // hash and tier; parent_hash is not tracked and left zero), in no particular order:
  // enough to rebuild its entries in another index (the router's fallback view).
  std::vector<kv::KvEvent> WorkerBlocks(std::string_view worker_id, int64_t max_blocks) const;
  // Whether the worker holds `hash` on `tier`.
  bool Contains(std::string_view worker_id, const kv::BlockHash& hash, kv::Tier tier) const;
  // Distinct hashes held by any worker.
  int64_t num_hashes() const { return static_cast<int64_t>(holders_.size()); }
  int32_t num_workers() const { return static_cast<int32_t>(slot_by_worker_.size()); }

 private:
  using Slot = uint32_t;
  struct Holder {
    Slot slot;
    uint8_t tier_mask;  // bit t: held on kv::Tier t
  };
  struct WorkerEntry {
    std::string worker_id;  // empty: free slot
    absl::flat_hash_set<kv::BlockHash> hashes;
  };

  Slot SlotFor(std::string_view worker_id);
  const Holder* FindHolder(const kv::BlockHash& hash, Slot slot) const;
  static int BestTier(uint8_t tier_mask);

  absl::flat_hash_map<kv::BlockHash, absl::InlinedVector<Holder, 2>> holders_;
  absl::flat_hash_map<std::string, Slot> slot_by_worker_;
  std::vector<WorkerEntry> workers_;  // by slot
  std::vector<Slot> free_slots_;
};

}  // namespace kvmesh::cluster
