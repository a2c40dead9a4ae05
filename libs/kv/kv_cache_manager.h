// KvCacheManager: per-request KV block tables over one BlockPool, with prefix caching,
// fork (parallel sampling) and copy-on-write — the bookkeeping half of paged attention
// (vLLM v1's KVCacheManager). No model math: the engine moves the bytes.
//
// Life of a request, as the scheduler drives it:
//   1. prefix = FindCachedPrefix(prompt)         leading full blocks already cached
//   2. AllocateSlots(id, prompt, n, &prefix)     takes those blocks, allocates for n tokens
//      ... the model writes K/V at the returned slot mapping ...
//   3. MarkComputed(id, tokens, computed)        newly full blocks become cached (kStored)
//   4. each decode step: AllocateSlots(id, tokens, 1, nullptr), MarkComputed(...)
//   5. Free(id)                                  blocks released tail first
// Any AllocateSlots may fail with kResourceExhausted and no side effects: the scheduler
// then preempts someone (Free) and retries.
//
// Per request the manager keeps: the block table (block i holds token positions
// [i*B, (i+1)*B) for block size B), the number of tokens whose KV is computed, and the
// hashes of its full blocks. Invariant: every block's pool ref_count equals the number
// of request tables that hold it (CheckInvariants verifies this).
//
// Thread-safety: not thread-safe; owned by the engine loop together with the scheduler.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/block_pool.h"
#include "kv/kv_tiers.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct KvCacheManagerOptions {
  int32_t num_blocks = 0;
  int32_t block_size_tokens = kDefaultBlockSizeTokens;
  bool enable_prefix_caching = true;
  // Identity of everything besides the tokens that KV depends on (model, adapter, KV
  // dtype): folded into every block hash, so caches and KV events of different models
  // never match.
  uint64_t salt = 0;
  Tier tier = Tier::kDevice;
  // Queue KV events (see BlockPool); the owner drains them every step.
  bool record_events = true;
};

// What FindCachedPrefix found: the leading full blocks of a prompt whose KV is cached,
// first in tier 0, then in the host tier. Valid until the next call that allocates or
// frees blocks: pass it straight to AllocateSlots, or drop it with ReleasePrefix (its
// host hits are pinned until one of the two).
struct ComputedPrefix {
  std::vector<BlockId> blocks;          // tier-0 hits, in position order
  std::vector<HostSlot> host_slots;     // then host-tier hits (onboarded by AllocateSlots)
  int32_t num_tokens = 0;               // (blocks + host_slots) * block_size_tokens
  // Blocks after those that only a connector below the host tier holds (disk, kv-store)
  // and that are worth loading (KvCacheManager::StartLoads); not part of num_tokens.
  int32_t num_loadable_blocks = 0;
  // A connector is still finding out whether it holds the blocks after those (a remote
  // lookup in flight, bounded by its deadline): the scheduler may wait for it.
  bool lookup_pending = false;
  std::vector<BlockHash> block_hashes;  // hashes of ALL full prompt blocks (>= blocks.size())

  int32_t num_blocks() const { return static_cast<int32_t>(blocks.size() + host_slots.size()); }
};

// Copy block `src`'s KV data (every layer) to `dst` before writing into `dst`.
struct BlockCopy {
  BlockId src;
  BlockId dst;
  bool operator==(const BlockCopy&) const = default;
};

// Where the model writes the K/V of consecutive token positions:
// slots[i] = block_table[p / B] * B + p % B for position p = first_position + i.
struct SlotMapping {
  int32_t first_position = 0;
  std::vector<int64_t> slots;
};

// The result of AllocateSlots.
struct KvAllocation {
  std::vector<BlockId> new_blocks;  // appended to the request's table, in order
  std::vector<BlockCopy> copies;    // copy-on-write: perform before writing the new tokens
  SlotMapping slot_mapping;         // one slot per new token
};

struct PrefixCacheStats {
  int64_t queries = 0;                      // FindCachedPrefix calls (with caching on)
  int64_t hits = 0;                         // ... that found at least one block
  int64_t prefix_cache_queries_tokens = 0;  // prompt tokens looked up
  int64_t prefix_cache_hit_tokens = 0;      // ... of which the KV was cached (any tier)
  int64_t host_hit_tokens = 0;              // ... of those, onboarded from the host tier
  double hit_rate() const {
    return prefix_cache_queries_tokens == 0
               ? 0.0
               : static_cast<double>(prefix_cache_hit_tokens) / static_cast<double>(prefix_cache_queries_tokens);
  }
};

// Occupancy, and slot waste for the memory-efficiency report. A slot is one token
// position of a used block; it is filled when some request holding the block has
// computed that position (shared blocks count once).
struct KvUsage {
  int32_t num_blocks = 0;
  int32_t used_blocks = 0;
  int32_t free_blocks = 0;
  int32_t cached_blocks = 0;
  double usage = 0;  // used_blocks / num_blocks
  int64_t allocated_slots = 0;  // used_blocks * block_size_tokens
  int64_t filled_slots = 0;
  int64_t wasted_slots = 0;  // allocated_slots - filled_slots
};

class KvCacheManager {
 public:
  // InvalidArgument for non-positive num_blocks or block_size_tokens.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const KvCacheManagerOptions& options);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // The leading full blocks of `prompt_tokens` whose hashes are cached, stopping at the
  // first miss. Never the whole prompt: at most (size - 1) / B blocks, so at least the
  // last prompt token is recomputed to produce logits. Counts the lookup in
  // prefix_cache_stats() (a retried request counts again). Empty when caching is off.
  // `cache_salt`: the request's (kv/block_hash.h); only blocks hashed with the same
  // salt match.
  ComputedPrefix FindCachedPrefix(std::span<const int32_t> prompt_tokens, std::string_view cache_salt = {});

  // Makes room for `num_new_tokens` tokens after the request's computed ones and returns
  // their slots. On the request's first call, `prefix` (from FindCachedPrefix on a prefix
  // of `all_tokens`, or null) seeds its table: its tier-0 blocks gain a reference, its
  // host hits get fresh blocks with a queued swap-in (TakeSwaps), and all count as
  // computed. On success the prefix is used up (its pins pass on); on error the caller
  // still holds it and must ReleasePrefix it. New blocks come from the pool; a shared block (ref_count > 1) that the
  // new tokens would write into is first replaced by a copy (returned in `copies`).
  // `all_tokens` are all tokens known so far (prompt + sampled); computed + new must
  // not exceed their count.
  // Errors, all without side effects: kResourceExhausted if the pool cannot supply every
  // block needed (the scheduler preempts and retries); InvalidArgument for a negative
  // count, too few tokens, or a prefix on a later call; FailedPrecondition for a stale
  // prefix (its blocks were evicted since the lookup).
  absl::StatusOr<KvAllocation> AllocateSlots(RequestId id, std::span<const int32_t> all_tokens,
                                             int32_t num_new_tokens, const ComputedPrefix* prefix = nullptr);

  // Records that the KV of the first `num_computed_tokens` of `all_tokens` is written.
  // Every block that became full is hashed and registered as cached (kStored); when an
  // equal block is cached already, the request keeps its own block unregistered.
  // FailedPrecondition for an unknown request; InvalidArgument if the count decreases,
  // exceeds the allocated slots or exceeds all_tokens. `cache_salt` must be the one the
  // request's prefix was looked up with.
  absl::Status MarkComputed(RequestId id, std::span<const int32_t> all_tokens, int32_t num_computed_tokens,
                            std::string_view cache_salt = {});

  // Drops a prefix that will not be passed to AllocateSlots: unpins its host hits.
  void ReleasePrefix(const ComputedPrefix& prefix);

  // ---- Lower tiers (kv/kv_tiers.h); all no-ops without them ----

  // Puts host (and disk) tiers under this pool: from now on evicted cached blocks are
  // offloaded and lookups continue into them. FailedPrecondition when prefix caching is
  // off or tiers are attached already.
  absl::Status AttachTiers(std::unique_ptr<KvTiers> tiers);
  bool has_tiers() const { return tiers_ != nullptr; }
  KvTiers* tiers() { return tiers_.get(); }
  const KvTiers* tiers() const { return tiers_.get(); }
  // The copies the next model step must run (see KvTiers); empty without tiers.
  KvSwaps TakeSwaps() {
    if (tiers_ == nullptr) return {};
    const TierCallTimer timer(&tier_call_seconds_);
    return tiers_->TakeSwaps();
  }
  // KvTiers::FinishSwaps: how many swap-ins failed their checksum (0 without tiers).
  int32_t FinishSwaps(const KvSwaps& swaps, bool copied, double out_seconds, double in_seconds,
                      std::span<const uint64_t> out_checksums = {}, std::span<const uint64_t> in_checksums = {}) {
    if (tiers_ == nullptr) return 0;
    const TierCallTimer timer(&tier_call_seconds_);
    return tiers_->FinishSwaps(swaps, copied, out_seconds, in_seconds, out_checksums, in_checksums);
  }
  // Starts loading, for `owner`, the connector blocks a lookup reported
  // (prefix.num_loadable_blocks) into the host tier; returns how many of them the load
  // covers from the first on, or that it was deferred (KvTiers::StartLoads: load holds
  // are capped). What they
  // read, and the lookup's host hits, stay pinned for `owner` until
  // ReleaseLoadHold(owner); the prefix itself must still be used or released.
  KvLoadStart StartLoads(RequestId owner, const ComputedPrefix& prefix);
  bool HasLoadHold(RequestId owner) const { return tiers_ != nullptr && tiers_->has_load_hold(owner); }
  // Drops `owner`'s load hold: call it once the owner is admitted or ends.
  void ReleaseLoadHold(RequestId owner) {
    if (tiers_ == nullptr) return;
    const TierCallTimer timer(&tier_call_seconds_);
    tiers_->ReleaseLoadHold(owner);
  }
  // Whether a block among `block_hashes` is still being loaded from a connector.
  // KvTiers::lookups_answered (0 without tiers).
  uint64_t lookups_answered() const { return tiers_ != nullptr ? tiers_->lookups_answered() : 0; }
  bool AnyLoading(std::span<const BlockHash> block_hashes) const {
    return tiers_ != nullptr && tiers_->AnyLoading(block_hashes);
  }
  void PollTiers() {
    if (tiers_ == nullptr) return;
    const TierCallTimer timer(&tier_call_seconds_);
    tiers_->Poll();
  }
  // Seconds spent inside calls into the lower tiers: their bookkeeping, the checksums
  // of offloaded blocks, disk submissions and completions (not the block copies, which
  // the model step runs). What the tiers cost a workload whose blocks never leave tier
  // 0 is this and nothing else; `kvmesh bench multi-turn` prints it.
  double tier_call_seconds() const { return tier_call_seconds_; }

  // Releases the request's blocks, last block first, so that its tail is evicted before
  // its prefix. FailedPrecondition for an unknown request.
  absl::Status Free(RequestId id);

  // Quarantine: keeps `blocks` out of use, whoever else holds or frees them, until
  // ReleaseHeldBlocks — blocks a writer outside the engine may still write into (a
  // failed KV transfer's, kv/kv_handoff_ledger.h). One reference each (BlockPool::
  // Hold): they count as used. InvalidArgument for an id out of range, nothing held.
  absl::Status HoldBlocks(std::span<const BlockId> blocks);
  // Drops one HoldBlocks reference per block. FailedPrecondition, nothing released, for
  // a block not held.
  absl::Status ReleaseHeldBlocks(std::span<const BlockId> blocks);
  int32_t num_held_blocks() const { return num_held_blocks_; }

  // Gives `child` the parent's table, computed count and computed blocks' hashes, sharing every block
  // (ref_count + 1): parallel sampling n > 1. The shared partial last block is copied on
  // the first write (AllocateSlots / PrepareAppend). FailedPrecondition for an unknown
  // parent, AlreadyExists for a known child.
  absl::Status Fork(RequestId parent, RequestId child);

  // Copy-on-write ahead of a decode step: if the block the next token goes into is
  // shared, swaps a fresh block into the table and returns the copy to perform (nullopt
  // when nothing needs copying). kResourceExhausted without side effects when no block
  // is available; FailedPrecondition for an unknown request.
  absl::StatusOr<std::optional<BlockCopy>> PrepareAppend(RequestId id);

  // Slots of positions [first_position, first_position + num_tokens) in the request's
  // table. FailedPrecondition for an unknown request; OutOfRange past the table.
  absl::StatusOr<SlotMapping> GetSlotMapping(RequestId id, int32_t first_position, int32_t num_tokens) const;

  // Evicts up to `max_blocks` cached (unused) blocks, LRU first; returns how many.
  int32_t EvictCachedBlocks(int32_t max_blocks) { return pool_->EvictCached(max_blocks); }
  // KV events since the last drain: the pool's (see BlockPool), then the lower tiers'
  // (tier kHost / kDisk).
  std::vector<KvEvent> DrainEvents();

  bool HasRequest(RequestId id) const { return requests_.contains(id); }
  // Every request holding a table. O(requests).
  std::vector<RequestId> request_ids() const;
  int32_t num_requests() const { return static_cast<int32_t>(requests_.size()); }
  // The request's block table; empty for an unknown request. Invalidated by any
  // mutating call.
  std::span<const BlockId> block_table(RequestId id) const;
  // 0 for an unknown request.
  int32_t num_computed_tokens(RequestId id) const;

  int32_t block_size_tokens() const { return pool_->block_size_tokens(); }
  int32_t num_blocks() const { return pool_->num_blocks(); }
  int32_t num_used_blocks() const { return pool_->num_used_blocks(); }
  int32_t num_free_blocks() const { return pool_->num_free_blocks(); }
  int32_t num_cached_blocks() const { return pool_->num_cached_blocks(); }
  // Fraction of blocks in use (cached blocks count as reclaimable, not used).
  double usage() const { return static_cast<double>(num_used_blocks()) / num_blocks(); }
  // Block counts plus slot waste. O(blocks in all tables).
  KvUsage GetUsage() const;
  const PrefixCacheStats& prefix_cache_stats() const { return prefix_stats_; }
  const BlockPool& pool() const { return *pool_; }
  const KvCacheManagerOptions& options() const { return options_; }

  // Pool invariants plus: each block's ref_count equals the number of tables holding it
  // plus its HoldBlocks references (so no table holds a free block), no table holds a block twice, computed counts fit
  // the tables, and every registered block holds its own hash or none. Internal on the
  // first violation. O(num_blocks + blocks in all tables); for tests.
  absl::Status CheckInvariants() const;

 private:
  struct RequestState {
    std::vector<BlockId> blocks;
    std::vector<BlockHash> block_hashes;  // of full blocks, may run ahead of the computed ones
    int32_t num_computed_tokens = 0;
    int32_t num_registered_blocks = 0;  // leading full blocks already offered to the pool
  };

  KvCacheManager(const KvCacheManagerOptions& options, std::unique_ptr<BlockPool> pool);
  SlotMapping MakeSlotMapping(const std::vector<BlockId>& blocks, int32_t first_position, int32_t num_tokens) const;

  const KvCacheManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  // Adds the time until its destruction to *total (steady clock; ~20 ns a reading).
  class TierCallTimer {
   public:
    explicit TierCallTimer(double* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
    ~TierCallTimer() { *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
    TierCallTimer(const TierCallTimer&) = delete;
    TierCallTimer& operator=(const TierCallTimer&) = delete;

   private:
    double* total_;
    std::chrono::steady_clock::time_point start_;
  };

  std::unique_ptr<KvTiers> tiers_;  // null without lower tiers
  double tier_call_seconds_ = 0;
  absl::flat_hash_map<RequestId, RequestState> requests_;
  absl::flat_hash_map<int32_t, int32_t> held_;  // HoldBlocks references by block id
  int32_t num_held_blocks_ = 0;                 // distinct blocks in held_
  PrefixCacheStats prefix_stats_;
};

}  // namespace kvmesh::kv
