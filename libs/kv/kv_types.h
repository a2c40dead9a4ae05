// Vocabulary of the paged KV cache: block and request ids, the 128-bit block hash,
// memory tiers and the KV events the global prefix index consumes.
//
// All types here are small values (copyable, comparable, hashable with Abseil).
//
// Thread-safety: plain values; no shared state.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <utility>

namespace kvmesh::kv {

// Tokens per KV block unless configured otherwise (vLLM's default too).
inline constexpr int32_t kDefaultBlockSizeTokens = 16;

// Where a block's KV data lives. Tier 0 is the accelerator (or, on a CPU-only worker,
// the compute pool); lower tiers hold offloaded blocks: the worker's host memory and
// disk, then the cluster kv-store that every worker shares.
enum class Tier : uint8_t { kDevice, kHost, kDisk, kStore };

// "device", "host", "disk", "store".
const char* TierName(Tier tier);

// Index of a block in one pool: 0 <= value < num_blocks. A block is never a pointer;
// its owners hold this id and the pool counts the references.
struct BlockId {
  int32_t value = -1;

  auto operator<=>(const BlockId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockId& id) {
    return H::combine(std::move(h), id.value);
  }
};

// One generation request (or one of its parallel samples) inside a KV manager.
struct RequestId {
  int64_t value = -1;

  auto operator<=>(const RequestId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const RequestId& id) {
    return H::combine(std::move(h), id.value);
  }
};

// Identity of a FULL block's contents: XXH3-128 chained over the parent block's hash,
// a salt (model / adapter) and the block's token ids (see kv/block_hash.h). Equal
// hashes are taken to mean equal KV; a 128-bit hash makes an accidental collision
// negligible (~2^-64 at 2^32 distinct blocks).
struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;

  auto operator<=>(const BlockHash&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& hash) {
    // Already uniformly distributed: the low word alone is a fine table hash.
    return H::combine(std::move(h), hash.low, hash.high);
  }
  // 32 hex digits, high word first.
  std::string ToHex() const;
};

// The parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash{};

// A change in the set of full blocks a pool holds, for the scheduler's global
// prefix index. Every store and every eviction of a hashed block emits exactly one.
struct KvEvent {
  enum class Kind : uint8_t {
    kStored,   // a full block's hash was registered: a prefix hit can now reuse it
    kRemoved,  // the block was evicted (handed out again or dropped): the hash is gone
  };
  Kind kind = Kind::kStored;
  BlockHash block_hash;
  BlockHash parent_hash;  // kRootBlockHash for the first block of a sequence
  Tier tier = Tier::kDevice;
  int32_t num_tokens = 0;  // tokens in the block (its block size: only full blocks are hashed)

  bool operator==(const KvEvent&) const = default;
};

}  // namespace kvmesh::kv
