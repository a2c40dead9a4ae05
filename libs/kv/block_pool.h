// BlockPool owns the fixed set of KV blocks of one pool (one tier, one layer group)
// and lends them out by id. It keeps only bookkeeping: a reference count, a content
// hash and free-list links per block; the KV bytes live in a KvStorage (kv/kv_layout.h)
// indexed by the same ids.
//
// Every block is in exactly one of three states; the counts partition num_blocks:
//   free   — ref_count == 0, no hash: holds nothing of value   (num_free_blocks)
//   cached — ref_count == 0, holds a hash: a full block nobody uses that a prefix hit
//            can revive with Touch() until Allocate() hands it out (num_cached_blocks)
//   used   — ref_count > 0, with or without a hash              (num_used_blocks)
// Free and cached blocks are both allocatable (num_available_blocks). A block holds a
// hash iff the hash map points to it: at most one block per hash.
//
// Eviction order: Allocate() takes free blocks first (oldest first), then cached blocks
// in LRU order (least recently released first). Taking a cached block evicts it: its
// hash is dropped and a kRemoved event is queued. Registering a hash queues kStored.
// NOTE: vLLM v1 keeps one queue for both; taking hash-less blocks first is never worse
// for the hit rate, and equal to it when every released block is cached.
//
// Thread-safety: not thread-safe; owned by the engine thread (through KvCacheManager).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct BlockPoolOptions {
  int32_t num_blocks = 0;
  int32_t block_size_tokens = kDefaultBlockSizeTokens;
  // When false, CacheBlock() registers nothing: released blocks are plain free blocks.
  bool enable_prefix_cache = true;
  // Reported in KV events.
  Tier tier = Tier::kDevice;
  // Queue KV events for DrainEvents(). The queue grows until drained: whoever enables
  // it drains it every engine step.
  bool record_events = true;
};

class BlockPool {
 public:
  // InvalidArgument unless num_blocks > 0 and block_size_tokens > 0.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const BlockPoolOptions& options);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Takes `n` blocks, each with ref_count 1 and no hash, in eviction order (see above).
  // Returns kResourceExhausted and takes nothing if fewer than `n` are available: the
  // caller decides to queue, preempt or offload. InvalidArgument if n < 0.
  absl::StatusOr<std::vector<BlockId>> Allocate(int32_t n);

  // Drops one reference per listed block (a block listed twice loses two); those that
  // reach zero join the cached list (if they hold a hash) or the free list, in this
  // order: the first listed is evicted first. InvalidArgument for an id out of range,
  // FailedPrecondition if a block would drop below zero references; on error nothing
  // changes.
  absl::Status Release(std::span<const BlockId> in_eviction_order);

  // Adds one reference per listed block; a cached block becomes used again (a prefix
  // hit) and leaves the eviction list. InvalidArgument for an id out of range,
  // FailedPrecondition for a free block (it holds no valid KV); on error nothing changes.
  absl::Status Touch(std::span<const BlockId> blocks);

  // Adds one reference per listed block whatever its state: a free block leaves the free
  // list (used, hash-less), a cached one the eviction list (its hash kept), so that
  // Allocate() hands none of them out until Release() drops the reference. For blocks
  // something outside the pool may still write into (a quarantine: KvCacheManager::
  // HoldBlocks). InvalidArgument for an id out of range; on error nothing changes.
  absl::Status Hold(std::span<const BlockId> blocks);

  // The block (used or cached) that holds `hash`, if any.
  std::optional<BlockId> LookupCached(const BlockHash& hash) const;

  // Registers `block`, which the caller has just filled completely, as holding `hash`
  // (child of `parent_hash`) and queues a kStored event. Returns false, changing
  // nothing, when prefix caching is off, when the block already holds this hash, or when
  // another block already holds it (the caller keeps its own block; the other stays the
  // cache entry). InvalidArgument for an id out of range; FailedPrecondition if the
  // block is not in use or already holds a different hash.
  absl::StatusOr<bool> CacheBlock(BlockId block, const BlockHash& hash, const BlockHash& parent_hash);

  // Evicts up to `max_blocks` cached blocks, least recently released first: they become
  // free and each queues a kRemoved event. Returns how many were evicted. With
  // max_blocks >= num_cached_blocks() this resets the prefix cache.
  int32_t EvictCached(int32_t max_blocks);

  // Called for every cached block that Allocate() or EvictCached() evicts, before its
  // hash is dropped and before anyone can write into it: the owner offloads it to a
  // lower tier (kv/kv_tiers.h). Must not call back into the pool.
  using EvictionListener = std::function<void(BlockId block, const BlockHash& hash, const BlockHash& parent_hash)>;
  void set_eviction_listener(EvictionListener listener) { eviction_listener_ = std::move(listener); }

  // Returns the queued KV events, oldest first, and empties the queue. Always empty
  // when record_events is off.
  std::vector<KvEvent> DrainEvents();
  int64_t num_pending_events() const { return static_cast<int64_t>(events_.size()); }

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size_tokens() const { return options_.block_size_tokens; }
  bool prefix_cache_enabled() const { return options_.enable_prefix_cache; }
  Tier tier() const { return options_.tier; }
  int32_t num_free_blocks() const { return free_.size; }
  int32_t num_cached_blocks() const { return cached_.size; }
  int32_t num_used_blocks() const { return num_blocks() - free_.size - cached_.size; }
  // What Allocate() can hand out: free + cached.
  int32_t num_available_blocks() const { return free_.size + cached_.size; }
  // Hashed blocks, used or cached: the size of the hash map.
  int32_t num_hashed_blocks() const { return static_cast<int32_t>(hash_to_block_.size()); }
  // Totals since creation: kStored and kRemoved events queued.
  int64_t num_stored() const { return num_stored_; }
  int64_t num_evictions() const { return num_evictions_; }

  // Per-block inspection; `block` must be in range (else 0 / nullopt / false).
  int32_t ref_count(BlockId block) const;
  std::optional<BlockHash> block_hash(BlockId block) const;
  bool IsValid(BlockId block) const { return block.value >= 0 && block.value < num_blocks(); }
  // Free then cached blocks, in the order Allocate() would take them. O(num_blocks).
  std::vector<BlockId> AllocatableBlocksInOrder() const;

  // Verifies every invariant stated above (lists, counts, hash map). Internal on the
  // first violation. O(num_blocks); for tests and debug builds.
  absl::Status CheckInvariants() const;

 private:
  // An intrusive doubly-linked list threaded through BlockMeta::prev/next.
  struct List {
    int32_t head = -1;
    int32_t tail = -1;
    int32_t size = 0;
  };
  struct BlockMeta {
    int32_t ref_count = 0;
    int32_t prev = -1;
    int32_t next = -1;
    bool has_hash = false;
    BlockHash hash;
    BlockHash parent_hash;
  };

  explicit BlockPool(const BlockPoolOptions& options);

  void PushBack(List& list, int32_t b);
  void Unlink(List& list, int32_t b);
  int32_t PopFront(List& list);
  // The list a block with ref_count 0 sits in.
  List& ListOf(const BlockMeta& meta) { return meta.has_hash ? cached_ : free_; }
  // Drops a block's hash and queues kRemoved. The block must hold one.
  void DropHash(int32_t b);

  const BlockPoolOptions options_;
  std::vector<BlockMeta> blocks_;
  List free_;
  List cached_;
  absl::flat_hash_map<BlockHash, int32_t> hash_to_block_;
  std::vector<KvEvent> events_;
  EvictionListener eviction_listener_;
  int64_t num_stored_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace kvmesh::kv
