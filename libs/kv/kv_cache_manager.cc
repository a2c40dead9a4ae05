#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kv/block_hash.h"

namespace kvmesh::kv {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(const KvCacheManagerOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                          BlockPool::Create({.num_blocks = options.num_blocks,
                                             .block_size_tokens = options.block_size_tokens,
                                             .enable_prefix_cache = options.enable_prefix_caching,
                                             .tier = options.tier,
                                             .record_events = options.record_events}));
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(options, std::move(pool)));
}

KvCacheManager::KvCacheManager(const KvCacheManagerOptions& options, std::unique_ptr<BlockPool> pool)
    : options_(options), pool_(std::move(pool)) {}

ComputedPrefix KvCacheManager::FindCachedPrefix(std::span<const int32_t> prompt_tokens,
                                                std::string_view cache_salt) {
  ComputedPrefix prefix;
  if (!options_.enable_prefix_caching) return prefix;
  const int32_t bs = block_size_tokens();
  prefix.block_hashes = HashFullBlocks(prompt_tokens, bs, options_.salt, cache_salt);
  // NOTE: the last prompt token is always recomputed: its logits start the generation.
  const size_t max_blocks = prompt_tokens.empty() ? 0 : (prompt_tokens.size() - 1) / static_cast<size_t>(bs);
  const size_t limit = std::min(max_blocks, prefix.block_hashes.size());
  for (size_t i = 0; i < limit; ++i) {
    const std::optional<BlockId> block = pool_->LookupCached(prefix.block_hashes[i]);
    if (!block.has_value()) break;
    prefix.blocks.push_back(*block);
  }
  if (tiers_ != nullptr && prefix.blocks.size() < limit) {
    const TierCallTimer timer(&tier_call_seconds_);
    const KvConnectorHits below =
        tiers_->ExtendPrefix(prefix.block_hashes, prefix.blocks.size(), limit, &prefix.host_slots);
    prefix.num_loadable_blocks = below.num_blocks;
    prefix.lookup_pending = below.pending;
  }
  prefix.num_tokens = prefix.num_blocks() * bs;
  ++prefix_stats_.queries;
  if (prefix.num_blocks() > 0) ++prefix_stats_.hits;
  prefix_stats_.prefix_cache_queries_tokens += static_cast<int64_t>(prompt_tokens.size());
  prefix_stats_.prefix_cache_hit_tokens += prefix.num_tokens;
  prefix_stats_.host_hit_tokens += static_cast<int64_t>(prefix.host_slots.size()) * bs;
  return prefix;
}

std::vector<KvEvent> KvCacheManager::DrainEvents() {
  std::vector<KvEvent> events = pool_->DrainEvents();
  if (tiers_ != nullptr) {
    const TierCallTimer timer(&tier_call_seconds_);
    std::vector<KvEvent> lower = tiers_->DrainEvents();
    events.insert(events.end(), lower.begin(), lower.end());
  }
  return events;
}

void KvCacheManager::ReleasePrefix(const ComputedPrefix& prefix) {
  if (tiers_ == nullptr || prefix.host_slots.empty()) return;
  const TierCallTimer timer(&tier_call_seconds_);
  tiers_->Release(prefix.host_slots);
}

absl::Status KvCacheManager::AttachTiers(std::unique_ptr<KvTiers> tiers) {
  if (!options_.enable_prefix_caching) {
    return absl::FailedPreconditionError("lower KV tiers need prefix caching: blocks are found by their hashes");
  }
  if (tiers_ != nullptr) return absl::FailedPreconditionError("KV tiers are attached already");
  tiers_ = std::move(tiers);
  pool_->set_eviction_listener([this](BlockId block, const BlockHash& hash, const BlockHash& parent) {
    const TierCallTimer timer(&tier_call_seconds_);
    tiers_->OnDeviceEvict(block, hash, parent);
  });
  return absl::OkStatus();
}

KvLoadStart KvCacheManager::StartLoads(RequestId owner, const ComputedPrefix& prefix) {
  if (tiers_ == nullptr || prefix.num_loadable_blocks <= 0) return {};
  const TierCallTimer timer(&tier_call_seconds_);
  return tiers_->StartLoads(owner, prefix.block_hashes, static_cast<size_t>(prefix.num_blocks()),
                            static_cast<size_t>(prefix.num_loadable_blocks), prefix.host_slots);
}

absl::StatusOr<KvAllocation> KvCacheManager::AllocateSlots(RequestId id, std::span<const int32_t> all_tokens,
                                                           int32_t num_new_tokens, const ComputedPrefix* prefix) {
  const int32_t bs = block_size_tokens();
  if (num_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AllocateSlots: negative token count ", num_new_tokens));
  }
  const auto it = requests_.find(id);
  const bool is_new = it == requests_.end();
  const bool has_prefix = prefix != nullptr && prefix->num_blocks() > 0;

  // 1. Validate everything before touching anything.
  if (has_prefix) {
    if (!is_new) {
      return absl::InvalidArgumentError(absl::StrCat("AllocateSlots: request ", id.value,
                                                     " already has blocks; a cached prefix only seeds a new one"));
    }
    if (prefix->num_tokens != static_cast<int64_t>(prefix->num_blocks()) * bs ||
        prefix->block_hashes.size() < static_cast<size_t>(prefix->num_blocks()) ||
        (!prefix->host_slots.empty() && tiers_ == nullptr)) {
      return absl::InvalidArgumentError("AllocateSlots: malformed ComputedPrefix");
    }
    for (size_t i = 0; i < prefix->blocks.size(); ++i) {
      const std::optional<BlockId> cached = pool_->LookupCached(prefix->block_hashes[i]);
      if (!cached.has_value() || *cached != prefix->blocks[i]) {
        return absl::FailedPreconditionError(absl::StrCat("AllocateSlots: stale prefix for request ", id.value,
                                                          ": block ", i, " was evicted since the lookup"));
      }
    }
  }
  static const std::vector<BlockId> kNoBlocks;
  const std::vector<BlockId>& old_table = is_new ? (has_prefix ? prefix->blocks : kNoBlocks) : it->second.blocks;
  const int64_t num_computed = is_new ? (has_prefix ? prefix->num_tokens : 0) : it->second.num_computed_tokens;
  const int64_t end = num_computed + num_new_tokens;
  if (end > static_cast<int64_t>(all_tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("AllocateSlots: request ", id.value, " has ", all_tokens.size(),
                                                   " tokens but ", num_computed, " computed + ", num_new_tokens,
                                                   " new were asked for"));
  }

  // 2. Count the blocks the pool must supply: new tail blocks, copies of shared blocks
  // the new tokens would write into, and cached prefix blocks that Touch takes off the
  // eviction list.
  const int64_t num_required = CeilDiv(end, bs);
  const int64_t num_tail = std::max<int64_t>(0, num_required - static_cast<int64_t>(old_table.size()));
  std::vector<int32_t> cow_indices;
  if (num_new_tokens > 0) {
    const int64_t last = std::min<int64_t>(num_required, static_cast<int64_t>(old_table.size()));
    for (int64_t j = num_computed / bs; j < last; ++j) {
      if (pool_->ref_count(old_table[j]) > 1) cow_indices.push_back(static_cast<int32_t>(j));
    }
  }
  int64_t num_revived = 0;
  if (has_prefix) {
    for (const BlockId b : prefix->blocks) num_revived += pool_->ref_count(b) == 0 ? 1 : 0;
  }
  const int64_t needed = num_tail + static_cast<int64_t>(cow_indices.size()) + num_revived;
  if (needed > pool_->num_available_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: request ", id.value, " needs ", needed, " blocks (", num_tail, " new, ", cow_indices.size(),
        " copy-on-write, ", num_revived, " cached prefix) but ", pool_->num_available_blocks(), " are available"));
  }

  // 3. Commit. Nothing below can fail short of a broken invariant.
  if (has_prefix) {
    if (absl::Status s = pool_->Touch(prefix->blocks); !s.ok()) return absl::InternalError(s.message());
  }
  absl::StatusOr<std::vector<BlockId>> fresh = pool_->Allocate(static_cast<int32_t>(num_tail + cow_indices.size()));
  if (!fresh.ok()) return absl::InternalError(fresh.status().message());

  RequestState& state = is_new ? requests_[id] : it->second;
  if (is_new && prefix != nullptr) {
    // The lookup hashed every full prompt block: keep them for MarkComputed.
    state.block_hashes = prefix->block_hashes;
    if (has_prefix) {
      state.blocks = prefix->blocks;
      state.num_computed_tokens = prefix->num_tokens;
      state.num_registered_blocks = static_cast<int32_t>(prefix->blocks.size());
    }
  }
  KvAllocation allocation;
  size_t next = 0;
  for (const int32_t j : cow_indices) {
    const BlockId src = state.blocks[j];
    const BlockId dst = (*fresh)[next++];
    // Only positions below num_computed hold data worth copying.
    if (static_cast<int64_t>(j) * bs < num_computed) allocation.copies.push_back(BlockCopy{src, dst});
    state.blocks[j] = dst;
    const BlockId released[] = {src};
    if (absl::Status s = pool_->Release(released); !s.ok()) return absl::InternalError(s.message());
  }
  const size_t first_onboarded = next;
  for (; next < fresh->size(); ++next) {
    state.blocks.push_back((*fresh)[next]);
    allocation.new_blocks.push_back((*fresh)[next]);
  }
  if (has_prefix && !prefix->host_slots.empty()) {
    // The host hits sit right after the tier-0 prefix: the first fresh tail blocks.
    const TierCallTimer timer(&tier_call_seconds_);
    for (size_t h = 0; h < prefix->host_slots.size(); ++h) {
      tiers_->QueueSwapIn((*fresh)[first_onboarded + h], prefix->host_slots[h]);
    }
  }
  allocation.slot_mapping = MakeSlotMapping(state.blocks, static_cast<int32_t>(num_computed), num_new_tokens);
  return allocation;
}

absl::Status KvCacheManager::MarkComputed(RequestId id, std::span<const int32_t> all_tokens,
                                          int32_t num_computed_tokens, std::string_view cache_salt) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("MarkComputed: unknown request ", id.value));
  }
  RequestState& state = it->second;
  const int32_t bs = block_size_tokens();
  const int64_t capacity = static_cast<int64_t>(state.blocks.size()) * bs;
  if (num_computed_tokens < state.num_computed_tokens || num_computed_tokens > capacity ||
      num_computed_tokens > static_cast<int64_t>(all_tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("MarkComputed: request ", id.value, " cannot go from ",
                                                   state.num_computed_tokens, " to ", num_computed_tokens,
                                                   " computed tokens (", capacity, " slots, ", all_tokens.size(),
                                                   " tokens)"));
  }
  state.num_computed_tokens = num_computed_tokens;
  if (!options_.enable_prefix_caching) return absl::OkStatus();
  const int32_t num_full = num_computed_tokens / bs;
  if (num_full <= state.num_registered_blocks) return absl::OkStatus();
  ExtendBlockHashes(all_tokens.first(static_cast<size_t>(num_full) * bs), bs, options_.salt, &state.block_hashes,
                    cache_salt);
  for (int32_t i = state.num_registered_blocks; i < num_full; ++i) {
    const BlockHash& parent = i == 0 ? kRootBlockHash : state.block_hashes[i - 1];
    // False when an equal block is cached already: keep ours, register nothing (vLLM
    // does the same; swapping tables under a running request is not worth it).
    KVMESH_ASSIGN_OR_RETURN(const bool stored, pool_->CacheBlock(state.blocks[i], state.block_hashes[i], parent));
    // NOTE: under write-back (the default) OnDeviceCache does nothing: skip the call and
    // its timer, once per newly cached block.
    if (stored && tiers_ != nullptr && tiers_->write_through()) {
      const TierCallTimer timer(&tier_call_seconds_);
      tiers_->OnDeviceCache(state.blocks[i], state.block_hashes[i], parent);
    }
  }
  state.num_registered_blocks = num_full;
  return absl::OkStatus();
}

absl::Status KvCacheManager::Free(RequestId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return absl::FailedPreconditionError(absl::StrCat("Free: unknown request ", id.value));
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  requests_.erase(it);
  if (absl::Status s = pool_->Release(reversed); !s.ok()) return absl::InternalError(s.message());
  return absl::OkStatus();
}

absl::Status KvCacheManager::Fork(RequestId parent, RequestId child) {
  const auto it = requests_.find(parent);
  if (it == requests_.end()) return absl::FailedPreconditionError(absl::StrCat("Fork: unknown parent ", parent.value));
  if (requests_.contains(child)) return absl::AlreadyExistsError(absl::StrCat("Fork: child ", child.value, " exists"));
  if (absl::Status s = pool_->Touch(it->second.blocks); !s.ok()) return absl::InternalError(s.message());
  RequestState copy = it->second;  // `it` may dangle once the map grows
  // The parent's hashes past its computed full blocks describe ITS future tokens (the
  // rest of its prompt); the child may continue differently.
  copy.block_hashes.resize(std::min<size_t>(copy.block_hashes.size(),
                                            static_cast<size_t>(copy.num_computed_tokens / block_size_tokens())));
  requests_.emplace(child, std::move(copy));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<BlockCopy>> KvCacheManager::PrepareAppend(RequestId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("PrepareAppend: unknown request ", id.value));
  }
  RequestState& state = it->second;
  const int32_t bs = block_size_tokens();
  const size_t j = static_cast<size_t>(state.num_computed_tokens / bs);
  if (j >= state.blocks.size() || pool_->ref_count(state.blocks[j]) <= 1) return std::optional<BlockCopy>();
  KVMESH_ASSIGN_OR_RETURN(std::vector<BlockId> fresh, pool_->Allocate(1));
  const BlockId src = state.blocks[j];
  state.blocks[j] = fresh[0];
  const BlockId released[] = {src};
  if (absl::Status s = pool_->Release(released); !s.ok()) return absl::InternalError(s.message());
  if (state.num_computed_tokens % bs == 0) return std::optional<BlockCopy>();  // nothing written there yet
  return std::optional<BlockCopy>(BlockCopy{src, fresh[0]});
}

SlotMapping KvCacheManager::MakeSlotMapping(const std::vector<BlockId>& blocks, int32_t first_position,
                                            int32_t num_tokens) const {
  const int32_t bs = block_size_tokens();
  SlotMapping mapping;
  mapping.first_position = first_position;
  mapping.slots.reserve(num_tokens);
  for (int32_t p = first_position; p < first_position + num_tokens; ++p) {
    mapping.slots.push_back(static_cast<int64_t>(blocks[p / bs].value) * bs + p % bs);
  }
  return mapping;
}

absl::StatusOr<SlotMapping> KvCacheManager::GetSlotMapping(RequestId id, int32_t first_position,
                                                           int32_t num_tokens) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("GetSlotMapping: unknown request ", id.value));
  }
  const int64_t capacity = static_cast<int64_t>(it->second.blocks.size()) * block_size_tokens();
  if (first_position < 0 || num_tokens < 0 || static_cast<int64_t>(first_position) + num_tokens > capacity) {
    return absl::OutOfRangeError(absl::StrCat("GetSlotMapping: positions [", first_position, ", ",
                                              static_cast<int64_t>(first_position) + num_tokens,
                                              ") outside the ", capacity, " allocated slots of request ", id.value));
  }
  return MakeSlotMapping(it->second.blocks, first_position, num_tokens);
}

std::vector<RequestId> KvCacheManager::request_ids() const {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, state] : requests_) ids.push_back(id);
  return ids;
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second.blocks;
}

int32_t KvCacheManager::num_computed_tokens(RequestId id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? 0 : it->second.num_computed_tokens;
}

KvUsage KvCacheManager::GetUsage() const {
  const int32_t bs = block_size_tokens();
  KvUsage u;
  u.num_blocks = num_blocks();
  u.used_blocks = num_used_blocks();
  u.free_blocks = num_free_blocks();
  u.cached_blocks = num_cached_blocks();
  u.usage = usage();
  u.allocated_slots = static_cast<int64_t>(u.used_blocks) * bs;
  // A shared block is as full as its fullest holder.
  std::vector<int32_t> fill(num_blocks(), 0);
  for (const auto& [id, state] : requests_) {
    for (size_t i = 0; i < state.blocks.size(); ++i) {
      const int64_t filled = std::clamp<int64_t>(state.num_computed_tokens - static_cast<int64_t>(i) * bs, 0, bs);
      int32_t& f = fill[state.blocks[i].value];
      f = std::max(f, static_cast<int32_t>(filled));
    }
  }
  for (const int32_t f : fill) u.filled_slots += f;
  u.wasted_slots = u.allocated_slots - u.filled_slots;
  return u;
}

absl::Status KvCacheManager::HoldBlocks(std::span<const BlockId> blocks) {
  KVMESH_RETURN_IF_ERROR(pool_->Hold(blocks));
  for (const BlockId b : blocks) {
    if (held_[b.value]++ == 0) ++num_held_blocks_;
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::ReleaseHeldBlocks(std::span<const BlockId> blocks) {
  absl::flat_hash_map<int32_t, int32_t> releases;
  for (const BlockId b : blocks) {
    const auto it = held_.find(b.value);
    if (it == held_.end() || ++releases[b.value] > it->second) {
      return absl::FailedPreconditionError(absl::StrCat("ReleaseHeldBlocks: block ", b.value, " is not held"));
    }
  }
  KVMESH_RETURN_IF_ERROR(pool_->Release(blocks));
  for (const BlockId b : blocks) {
    if (--held_[b.value] == 0) {
      held_.erase(b.value);
      --num_held_blocks_;
    }
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::CheckInvariants() const {
  KVMESH_RETURN_IF_ERROR(pool_->CheckInvariants());
  if (tiers_ != nullptr) KVMESH_RETURN_IF_ERROR(tiers_->CheckInvariants());
  const int32_t bs = block_size_tokens();
  std::vector<int32_t> holders(num_blocks(), 0);
  for (const auto& [id, state] : requests_) {
    for (const BlockId b : state.blocks) {
      if (!pool_->IsValid(b)) {
        return absl::InternalError(absl::StrCat("request ", id.value, " holds invalid block ", b.value));
      }
      ++holders[b.value];
    }
    std::vector<BlockId> sorted = state.blocks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return absl::InternalError(absl::StrCat("request ", id.value, " holds a block twice"));
    }
    if (state.num_computed_tokens < 0 || state.num_computed_tokens > static_cast<int64_t>(state.blocks.size()) * bs) {
      return absl::InternalError(absl::StrCat("request ", id.value, " has ", state.num_computed_tokens,
                                              " computed tokens in ", state.blocks.size(), " blocks"));
    }
    if (state.num_registered_blocks > state.num_computed_tokens / bs ||
        (options_.enable_prefix_caching &&
         state.num_registered_blocks > static_cast<int32_t>(state.block_hashes.size()))) {
      return absl::InternalError(absl::StrCat("request ", id.value, " registered blocks past its computed ones"));
    }
    if (options_.enable_prefix_caching) {
      for (int32_t i = 0; i < state.num_registered_blocks; ++i) {
        const std::optional<BlockHash> h = pool_->block_hash(state.blocks[i]);
        if (h.has_value() && *h != state.block_hashes[i]) {
          return absl::InternalError(
              absl::StrCat("request ", id.value, " block ", i, " holds a hash other than its contents'"));
        }
      }
    }
  }
  for (const auto& [b, n] : held_) holders[b] += n;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    if (holders[b] != pool_->ref_count(BlockId{b})) {
      return absl::InternalError(absl::StrCat("block ", b, " has ref_count ", pool_->ref_count(BlockId{b}), " but ",
                                              holders[b], " tables hold it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
