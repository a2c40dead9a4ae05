#include "kv_store/store_key.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace kvmesh::kv_store {
namespace {

static_assert(std::endian::native == std::endian::little, "store keys assume little-endian");

// A domain tag first, so a scope digest can never equal a block hash or another
// XXH3-128 of kvmesh by construction of its input.
constexpr char kScopeTag[] = "kvmesh.kv_store.scope";

void AddU64(XXH3_state_t* state, uint64_t v) { XXH3_128bits_update(state, &v, sizeof(v)); }

void AddString(XXH3_state_t* state, const std::string& s) {
  AddU64(state, s.size());
  XXH3_128bits_update(state, s.data(), s.size());
}

XXH128_hash_t ScopeDigest(const StoreKeyScope& scope) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, kScopeTag, sizeof(kScopeTag));
  AddU64(&state, kKvStoreLayoutVersion);
  AddString(&state, scope.model);
  const kv::KvBlockSpec& b = scope.block_spec;
  for (const int64_t v : {int64_t{b.num_layers}, int64_t{b.num_kv_heads}, int64_t{b.head_dim},
                          int64_t{b.block_size_tokens}, static_cast<int64_t>(b.dtype), b.block_bytes,
                          int64_t{scope.tp_rank}, int64_t{scope.tp_size}}) {
    AddU64(&state, static_cast<uint64_t>(v));
  }
  AddString(&state, scope.cache_salt);
  return XXH3_128bits_digest(&state);
}

StoreKey Combine(uint64_t scope_low, uint64_t scope_high, const kv::BlockHash& block) {
  const uint64_t words[4] = {scope_low, scope_high, block.low, block.high};
  const XXH128_hash_t h = XXH3_128bits(words, sizeof(words));
  return StoreKey{.low = h.low64, .high = h.high64};
}

}  // namespace

std::string StoreKey::ToHex() const { return absl::StrFormat("%016x%016x", high, low); }

StoreKey DeriveStoreKey(const kv::BlockHash& block, const StoreKeyScope& scope) {
  const XXH128_hash_t s = ScopeDigest(scope);
  return Combine(s.low64, s.high64, block);
}

absl::StatusOr<StoreKeySpace> StoreKeySpace::Create(const StoreKeyScope& scope) {
  if (scope.model.empty()) return absl::InvalidArgumentError("store key scope: the model name is empty");
  const kv::KvBlockSpec& b = scope.block_spec;
  if (b.num_layers <= 0 || b.num_kv_heads <= 0 || b.head_dim <= 0 || b.block_size_tokens <= 0 ||
      b.block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key scope: the block layout needs positive num_layers, num_kv_heads, head_dim, block_size_tokens "
        "and block_bytes (got ",
        b.num_layers, ", ", b.num_kv_heads, ", ", b.head_dim, ", ", b.block_size_tokens, ", ", b.block_bytes, ")"));
  }
  if (scope.tp_size < 1 || scope.tp_rank < 0 || scope.tp_rank >= scope.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("store key scope: tp_rank ", scope.tp_rank,
                                                   " is not a rank of tp_size ", scope.tp_size));
  }
  const XXH128_hash_t s = ScopeDigest(scope);
  return StoreKeySpace(s.low64, s.high64);
}

StoreKey StoreKeySpace::Key(const kv::BlockHash& block) const { return Combine(scope_low_, scope_high_, block); }

std::vector<StoreKey> StoreKeySpace::Keys(std::span<const kv::BlockHash> blocks) const {
  std::vector<StoreKey> keys;
  keys.reserve(blocks.size());
  for (const kv::BlockHash& b : blocks) keys.push_back(Key(b));
  return keys;
}

}  // namespace kvmesh::kv_store
