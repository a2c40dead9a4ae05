// Content hashes of full KV blocks, the keys of prefix caching.
//
// A block's hash is XXH3-128 over (parent hash, salt, token ids): chaining over the
// parent makes a hash identify the whole prefix up to and including the block, so two
// requests share a block only when everything before it is equal too. The salt
// separates caches whose KV differs for equal tokens (another model, LoRA adapter or
// KV dtype). Only FULL blocks are hashed: a partly filled block is still being written.
//
// A request's cache_salt (vLLM's field: tenants that must not share KV) enters only the
// first block, as vLLM's extra keys do: that block chains from CacheSaltRoot(cache_salt)
// instead of kRootBlockHash, so every later block differs by chaining. Requests share a
// block only when their salts are equal; without a salt every hash is what it was
// before the field existed. NOTE: the first block's recorded parent (KvEvent,
// BlockPool) stays kRootBlockHash: it marks "no block before this one", and the salted
// root is not a block anyone holds.
//
// The hash is deterministic across processes and machines of the same byte order
// (tokens are fed as little-endian int32), so workers and the scheduler's global
// prefix index agree on it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kv/kv_types.h"

namespace kvmesh::kv {

// The seed the first block of a request with `cache_salt` chains from: kRootBlockHash
// for "" (no salt), else XXH3-128 of the salt under a domain tag.
BlockHash CacheSaltRoot(std::string_view cache_salt);

// The hash of one full block whose predecessor has hash `parent` (for a sequence's
// first block: CacheSaltRoot(its cache_salt), kRootBlockHash without one). `tokens` are the block's token ids, block_size of them.
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t salt);

// The chained hashes of every full block of `tokens` (a trailing partial block is
// not hashed): tokens.size() / block_size_tokens of them. Empty if block_size_tokens <= 0.
// The first chains from CacheSaltRoot(cache_salt).
std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size_tokens,
                                      uint64_t salt, std::string_view cache_salt = {});

// Appends to `*hashes` the hashes of the full blocks of `tokens` that it does not hold
// yet, chaining from its last entry, so a growing sequence is hashed once per block.
// `*hashes` must hold the hashes of the leading blocks of these same tokens and
// `cache_salt` (which only matters while `*hashes` is empty).
void ExtendBlockHashes(std::span<const int32_t> tokens, int32_t block_size_tokens, uint64_t salt,
                       std::vector<BlockHash>* hashes, std::string_view cache_salt = {});

}  // namespace kvmesh::kv
