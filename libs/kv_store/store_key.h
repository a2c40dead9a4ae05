// StoreKey: the canonical identity of one block in the cluster KV store, and how a
// client derives it (docs/architecture.md, "The cluster KV store").
//
// A store block is one TP rank's shard of one full KV block, every layer. Two blocks may
// share a key only when their bytes are interchangeable, so the key is XXH3-128 over
//   - the chained block hash (kv/block_hash.h: the whole token prefix up to and
//     including the block, already salted with the model / adapter / KV dtype salt),
//   - the model's name,
//   - the block layout (kv::KvBlockSpec: layers, KV heads per rank, head_dim, tokens per
//     block, KV dtype, bytes) and kKvStoreLayoutVersion (kv/kv_layout.h's arrangement),
//   - the TP rank and degree,
//   - a cache_salt (vLLM's field): a tenant's blocks are invisible to a request
//     without the same salt, because it cannot name them. NOTE: KvStoreConnector leaves
//     it empty: it serves every request of a worker with one scope, and the request's
//     salt is in the chained block hash already (kv/block_hash.h: the first block chains
//     from the salt, every later one from it), so folding it again would add nothing.
// Strings are length-prefixed and integers fixed-width little-endian, so no two
// different scopes serialize alike. The store itself never sees any of this: it holds
// opaque 128-bit keys.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kv/kv_block_spec.h"
#include "kv/kv_connector.h"
#include "kv/kv_types.h"

namespace kvmesh::kv_store {

// Bump when the bytes a key names change meaning (the block layout of kv/kv_layout.h,
// or the arrangement of layers in a store block): every old key then misses.
inline constexpr uint32_t kKvStoreLayoutVersion = 1;

struct StoreKey {
  uint64_t low = 0;
  uint64_t high = 0;

  auto operator<=>(const StoreKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const StoreKey& key) {
    return H::combine(std::move(h), key.low, key.high);
  }
  // 32 hex digits, high word first.
  std::string ToHex() const;
};

// Everything besides the chained block hash that names a store block.
struct StoreKeyScope {
  std::string model;           // the served model's name
  kv::KvBlockSpec block_spec;  // one rank's block layout
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  std::string cache_salt;      // "": none (the connector's case: the hash carries it)
};

// The key of the block with chained hash `block` under `scope`. Pure; any differing
// field of either gives another key.
StoreKey DeriveStoreKey(const kv::BlockHash& block, const StoreKeyScope& scope);

// DeriveStoreKey with the scope hashed once (one per request and rank): Key() then
// costs one 32-byte hash.
class StoreKeySpace {
 public:
  // InvalidArgument for an empty model name, a non-positive layout dimension or size,
  // tp_size < 1, or tp_rank outside [0, tp_size).
  static absl::StatusOr<StoreKeySpace> Create(const StoreKeyScope& scope);

  StoreKey Key(const kv::BlockHash& block) const;
  std::vector<StoreKey> Keys(std::span<const kv::BlockHash> blocks) const;

  // The scope's digest, which names this key space to whoever must derive the same
  // keys without the scope itself (the scheduler, from a worker's registration).
  kv::SharedKeySpace id() const { return {.low = scope_low_, .high = scope_high_}; }
  static StoreKeySpace FromId(const kv::SharedKeySpace& id) { return StoreKeySpace(id.low, id.high); }

 private:
  StoreKeySpace(uint64_t low, uint64_t high) : scope_low_(low), scope_high_(high) {}

  uint64_t scope_low_;
  uint64_t scope_high_;
};

}  // namespace kvmesh::kv_store
