#include "kv/block_hash.h"

#include <bit>
#include <cstring>
#include <string_view>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation per block
#include <xxhash.h>

namespace kvmesh::kv {

// NOTE: tokens are hashed as their in-memory int32 bytes; defining the hash as
// little-endian keeps it portable to every machine kvmesh targets (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little, "block hashes assume little-endian");

BlockHash CacheSaltRoot(std::string_view cache_salt) {
  if (cache_salt.empty()) return kRootBlockHash;
  // NOTE: the tag puts roots in their own input domain: a root equal to some block's hash
  // would take a 128-bit collision, not a salt chosen to look like a block's input.
  static constexpr std::string_view kTag = "kvmesh.cache_salt.v1";
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, kTag.data(), kTag.size());
  XXH3_128bits_update(&state, cache_salt.data(), cache_salt.size());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{.low = h.low64, .high = h.high64};
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t salt) {
  // Header: parent.low, parent.high, salt, token count (so a block of a different size
  // can never collide with this one by construction).
  uint64_t header[4] = {parent.low, parent.high, salt, static_cast<uint64_t>(tokens.size())};
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, header, sizeof(header));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{.low = h.low64, .high = h.high64};
}

std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size_tokens,
                                      uint64_t salt, std::string_view cache_salt) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(tokens, block_size_tokens, salt, &hashes, cache_salt);
  return hashes;
}

void ExtendBlockHashes(std::span<const int32_t> tokens, int32_t block_size_tokens, uint64_t salt,
                       std::vector<BlockHash>* hashes, std::string_view cache_salt) {
  if (block_size_tokens <= 0) return;
  const size_t bs = static_cast<size_t>(block_size_tokens);
  const size_t num_full = tokens.size() / bs;
  if (hashes->size() >= num_full) return;
  hashes->reserve(num_full);
  BlockHash parent = hashes->empty() ? CacheSaltRoot(cache_salt) : hashes->back();
  for (size_t b = hashes->size(); b < num_full; ++b) {
    parent = HashBlock(parent, tokens.subspan(b * bs, bs), salt);
    hashes->push_back(parent);
  }
}

}  // namespace kvmesh::kv
