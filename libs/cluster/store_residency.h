// StoreResidency: the scheduler's mirror of which blocks the cluster kv-stores hold,
// built from the stores' own events (KvStore.Events, read by a StoreEventsReader per
// store), so that placement can count a prompt's blocks that a worker would load from
// a store instead of recomputing (the kv::Tier::kStore column of PrefixMatch).
//
// A store is mirrored per epoch: a page with `reset` (the store restarted with a new
// epoch, or the reader fell behind its journal) replaces everything known of it, so a
// restarted, empty store is never believed to hold what its previous life did. A store
// that cannot be read for a while is forgotten (Forget): a dead store is a miss.
//
// Keys are opaque StoreKeys; a worker's registration names its key spaces
// (kv::SharedKeySpace), from which LeadingRun derives a prompt's keys. A block counts
// only when every one of the worker's key spaces holds it (each TP rank's share).
//
// Memory: one hash-map entry per (store, key) plus one per distinct key.
//
// Thread-safety: not thread-safe; owned by WorkerRegistry under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kv/kv_connector.h"
#include "kv/kv_types.h"
#include "kv_store/store_event_journal.h"
#include "kv_store/store_key.h"

namespace kvmesh::cluster {

class StoreResidency {
 public:
  StoreResidency() = default;
  StoreResidency(const StoreResidency&) = delete;
  StoreResidency& operator=(const StoreResidency&) = delete;

  // Applies one page read from the store at `address` (in the order they were read).
  // Returns true when it replaced what was known of the store (a reset).
  bool Apply(std::string_view address, const kv_store::StoreEventsPage& page);
  // Forgets the store (unreachable past the scheduler's patience).
  void Forget(std::string_view address);

  // How many of hashes[first, ...) from `first` on every key space in `spaces` holds
  // in some store; 0 with no key spaces.
  int32_t LeadingRun(std::span<const kv::SharedKeySpace> spaces, std::span<const kv::BlockHash> hashes,
                     size_t first) const;

  // LeadingRun for many workers against one prompt: each key space's keys are derived
  // once (workers of one model share their key spaces). Must not outlive either.
  class Matcher {
   public:
    Matcher(const StoreResidency& residency, std::span<const kv::BlockHash> hashes)
        : residency_(residency), hashes_(hashes) {}
    int32_t LeadingRun(std::span<const kv::SharedKeySpace> spaces, size_t first);

   private:
    const StoreResidency& residency_;
    const std::span<const kv::BlockHash> hashes_;
    absl::flat_hash_map<kv::SharedKeySpace, std::vector<char>> held_;  // per hash: held in some store
  };

  bool Contains(const kv_store::StoreKey& key) const { return holders_.contains(key); }
  // Blocks mirrored for the store; 0 when unknown.
  int64_t num_blocks(std::string_view address) const;
  // The epoch mirrored for the store; 0 when unknown.
  uint64_t epoch(std::string_view address) const;
  int64_t num_keys() const { return static_cast<int64_t>(holders_.size()); }

 private:
  struct Store {
    uint64_t epoch = 0;
    absl::flat_hash_set<kv_store::StoreKey> keys;
  };
  void Add(Store& store, const kv_store::StoreKey& key);
  void Remove(Store& store, const kv_store::StoreKey& key);
  void Clear(Store& store);

  absl::flat_hash_map<std::string, Store> stores_;
  absl::flat_hash_map<kv_store::StoreKey, int32_t> holders_;  // key -> stores holding it
};

}  // namespace kvmesh::cluster
