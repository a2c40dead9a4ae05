#include "kv/block_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const BlockPoolOptions& options) {
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool needs num_blocks > 0, got ", options.num_blocks));
  }
  if (options.block_size_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool needs block_size_tokens > 0, got ", options.block_size_tokens));
  }
  return std::unique_ptr<BlockPool>(new BlockPool(options));
}

BlockPool::BlockPool(const BlockPoolOptions& options) : options_(options), blocks_(options.num_blocks) {
  for (int32_t b = 0; b < options.num_blocks; ++b) PushBack(free_, b);
}

void BlockPool::PushBack(List& list, int32_t b) {
  BlockMeta& m = blocks_[b];
  m.prev = list.tail;
  m.next = -1;
  if (list.tail >= 0) {
    blocks_[list.tail].next = b;
  } else {
    list.head = b;
  }
  list.tail = b;
  ++list.size;
}

void BlockPool::Unlink(List& list, int32_t b) {
  BlockMeta& m = blocks_[b];
  if (m.prev >= 0) {
    blocks_[m.prev].next = m.next;
  } else {
    list.head = m.next;
  }
  if (m.next >= 0) {
    blocks_[m.next].prev = m.prev;
  } else {
    list.tail = m.prev;
  }
  m.prev = m.next = -1;
  --list.size;
}

int32_t BlockPool::PopFront(List& list) {
  const int32_t b = list.head;
  Unlink(list, b);
  return b;
}

void BlockPool::DropHash(int32_t b) {
  BlockMeta& m = blocks_[b];
  if (eviction_listener_) eviction_listener_(BlockId{b}, m.hash, m.parent_hash);
  hash_to_block_.erase(m.hash);
  m.has_hash = false;
  ++num_evictions_;
  if (options_.record_events) {
    events_.push_back(KvEvent{.kind = KvEvent::Kind::kRemoved,
                              .block_hash = m.hash,
                              .parent_hash = m.parent_hash,
                              .tier = options_.tier,
                              .num_tokens = options_.block_size_tokens});
  }
  m.hash = BlockHash{};
  m.parent_hash = BlockHash{};
}

absl::StatusOr<std::vector<BlockId>> BlockPool::Allocate(int32_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: negative block count ", n));
  if (n > num_available_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV block pool exhausted: need ", n, " blocks, ",
                                                     num_available_blocks(), " available (", free_.size,
                                                     " free + ", cached_.size, " cached) of ", num_blocks()));
  }
  std::vector<BlockId> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    int32_t b;
    if (free_.size > 0) {
      b = PopFront(free_);
    } else {
      b = PopFront(cached_);
      DropHash(b);  // evicted: handed to someone else
    }
    blocks_[b].ref_count = 1;
    out.push_back(BlockId{b});
  }
  return out;
}

absl::Status BlockPool::Release(std::span<const BlockId> in_eviction_order) {
  for (const BlockId id : in_eviction_order) {
    if (!IsValid(id)) return absl::InvalidArgumentError(absl::StrCat("Release: block ", id.value, " out of range"));
  }
  // Decrement first, rolling back on an underflow, so an error changes nothing.
  for (size_t i = 0; i < in_eviction_order.size(); ++i) {
    BlockMeta& m = blocks_[in_eviction_order[i].value];
    if (m.ref_count <= 0) {
      for (size_t j = 0; j < i; ++j) ++blocks_[in_eviction_order[j].value].ref_count;
      return absl::FailedPreconditionError(
          absl::StrCat("Release: block ", in_eviction_order[i].value, " has no reference left (double free)"));
    }
    --m.ref_count;
  }
  for (const BlockId id : in_eviction_order) {
    BlockMeta& m = blocks_[id.value];
    // A block listed twice reaches zero once; link it only when it is not linked yet.
    if (m.ref_count == 0 && m.prev < 0 && m.next < 0 && ListOf(m).head != id.value) {
      PushBack(ListOf(m), id.value);
    }
  }
  return absl::OkStatus();
}

absl::Status BlockPool::Touch(std::span<const BlockId> blocks) {
  for (const BlockId id : blocks) {
    if (!IsValid(id)) return absl::InvalidArgumentError(absl::StrCat("Touch: block ", id.value, " out of range"));
    const BlockMeta& m = blocks_[id.value];
    if (m.ref_count == 0 && !m.has_hash) {
      return absl::FailedPreconditionError(
          absl::StrCat("Touch: block ", id.value, " is free and holds no cached KV"));
    }
  }
  for (const BlockId id : blocks) {
    BlockMeta& m = blocks_[id.value];
    if (m.ref_count == 0) Unlink(cached_, id.value);
    ++m.ref_count;
  }
  return absl::OkStatus();
}

absl::Status BlockPool::Hold(std::span<const BlockId> blocks) {
  for (const BlockId id : blocks) {
    if (!IsValid(id)) return absl::InvalidArgumentError(absl::StrCat("Hold: block ", id.value, " out of range"));
  }
  for (const BlockId id : blocks) {
    BlockMeta& m = blocks_[id.value];
    if (m.ref_count == 0) Unlink(ListOf(m), id.value);
    ++m.ref_count;
  }
  return absl::OkStatus();
}

std::optional<BlockId> BlockPool::LookupCached(const BlockHash& hash) const {
  const auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return std::nullopt;
  return BlockId{it->second};
}

absl::StatusOr<bool> BlockPool::CacheBlock(BlockId block, const BlockHash& hash, const BlockHash& parent_hash) {
  if (!IsValid(block)) {
    return absl::InvalidArgumentError(absl::StrCat("CacheBlock: block ", block.value, " out of range"));
  }
  BlockMeta& m = blocks_[block.value];
  if (m.ref_count == 0) {
    return absl::FailedPreconditionError(absl::StrCat("CacheBlock: block ", block.value, " is not in use"));
  }
  if (!options_.enable_prefix_cache) return false;
  if (m.has_hash) {
    if (m.hash == hash) return false;
    return absl::FailedPreconditionError(absl::StrCat("CacheBlock: block ", block.value, " already holds hash ",
                                                      m.hash.ToHex(), ", not ", hash.ToHex()));
  }
  if (!hash_to_block_.emplace(hash, block.value).second) return false;  // another block holds it
  m.has_hash = true;
  m.hash = hash;
  m.parent_hash = parent_hash;
  ++num_stored_;
  if (options_.record_events) {
    events_.push_back(KvEvent{.kind = KvEvent::Kind::kStored,
                              .block_hash = hash,
                              .parent_hash = parent_hash,
                              .tier = options_.tier,
                              .num_tokens = options_.block_size_tokens});
  }
  return true;
}

int32_t BlockPool::EvictCached(int32_t max_blocks) {
  int32_t evicted = 0;
  while (evicted < max_blocks && cached_.size > 0) {
    const int32_t b = PopFront(cached_);
    DropHash(b);
    PushBack(free_, b);
    ++evicted;
  }
  return evicted;
}

std::vector<KvEvent> BlockPool::DrainEvents() { return std::exchange(events_, {}); }

int32_t BlockPool::ref_count(BlockId block) const { return IsValid(block) ? blocks_[block.value].ref_count : 0; }

std::optional<BlockHash> BlockPool::block_hash(BlockId block) const {
  if (!IsValid(block) || !blocks_[block.value].has_hash) return std::nullopt;
  return blocks_[block.value].hash;
}

std::vector<BlockId> BlockPool::AllocatableBlocksInOrder() const {
  std::vector<BlockId> out;
  out.reserve(num_available_blocks());
  for (int32_t b = free_.head; b >= 0; b = blocks_[b].next) out.push_back(BlockId{b});
  for (int32_t b = cached_.head; b >= 0; b = blocks_[b].next) out.push_back(BlockId{b});
  return out;
}

absl::Status BlockPool::CheckInvariants() const {
  // 1. Walk both lists: each member has ref_count 0 and the right hash state, once.
  std::vector<uint8_t> seen(blocks_.size(), 0);
  auto walk = [&](const List& list, bool cached, const char* name) -> absl::Status {
    int32_t count = 0;
    int32_t prev = -1;
    for (int32_t b = list.head; b >= 0; b = blocks_[b].next) {
      if (b >= num_blocks()) return absl::InternalError(absl::StrCat(name, " list: bad link ", b));
      if (seen[b]) return absl::InternalError(absl::StrCat(name, " list: block ", b, " linked twice"));
      seen[b] = 1;
      const BlockMeta& m = blocks_[b];
      if (m.prev != prev) return absl::InternalError(absl::StrCat(name, " list: bad prev link at ", b));
      if (m.ref_count != 0) {
        return absl::InternalError(absl::StrCat(name, " list: block ", b, " has ref_count ", m.ref_count));
      }
      if (m.has_hash != cached) {
        return absl::InternalError(absl::StrCat(name, " list: block ", b, " has_hash=", m.has_hash));
      }
      prev = b;
      ++count;
    }
    if (list.tail != prev) return absl::InternalError(absl::StrCat(name, " list: bad tail"));
    if (count != list.size) {
      return absl::InternalError(absl::StrCat(name, " list: size ", list.size, " but ", count, " linked"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = walk(free_, false, "free"); !s.ok()) return s;
  if (absl::Status s = walk(cached_, true, "cached"); !s.ok()) return s;
  // 2. Every unlinked block is used; every hashed block is the map's entry for its hash.
  int32_t hashed = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (!seen[b] && m.ref_count <= 0) {
      return absl::InternalError(absl::StrCat("block ", b, " is in no list but has ref_count ", m.ref_count));
    }
    if (m.has_hash) {
      ++hashed;
      const auto it = hash_to_block_.find(m.hash);
      if (it == hash_to_block_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("block ", b, " holds hash ", m.hash.ToHex(), " the map lacks"));
      }
    }
  }
  // 3. The map points only at blocks holding that hash (so, with 2., it is a bijection).
  for (const auto& [hash, b] : hash_to_block_) {
    if (b < 0 || b >= num_blocks() || !blocks_[b].has_hash || blocks_[b].hash != hash) {
      return absl::InternalError(absl::StrCat("hash ", hash.ToHex(), " maps to block ", b, " which does not hold it"));
    }
  }
  if (hashed != num_hashed_blocks()) return absl::InternalError("hash map size differs from hashed blocks");
  if (num_free_blocks() + num_cached_blocks() + num_used_blocks() != num_blocks()) {
    return absl::InternalError("free + cached + used != num_blocks");
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
