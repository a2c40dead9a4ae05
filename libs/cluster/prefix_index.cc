#include "cluster/prefix_index.h"

#include <algorithm>
#include <bit>

#include "core/status_macros.h"

namespace kvmesh::cluster {

GlobalPrefixIndex::Slot GlobalPrefixIndex::SlotFor(std::string_view worker_id) {
  auto it = slot_by_worker_.find(ToAbsl(worker_id));
  if (it != slot_by_worker_.end()) return it->second;
  Slot slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<Slot>(workers_.size());
    workers_.emplace_back();
  }
  workers_[slot].worker_id = std::string(worker_id);
  slot_by_worker_.emplace(std::string(worker_id), slot);
  return slot;
}

const GlobalPrefixIndex::Holder* GlobalPrefixIndex::FindHolder(const kv::BlockHash& hash, Slot slot) const {
  auto it = holders_.find(hash);
  if (it == holders_.end()) return nullptr;
  for (const Holder& holder : it->second) {
    if (holder.slot == slot) return &holder;
  }
  return nullptr;
}

int GlobalPrefixIndex::BestTier(uint8_t tier_mask) { return std::countr_zero(static_cast<unsigned>(tier_mask)); }

void GlobalPrefixIndex::Apply(std::string_view worker_id, std::span<const kv::KvEvent> events) {
  if (events.empty()) return;
  const Slot slot = SlotFor(worker_id);
  WorkerEntry& worker = workers_[slot];
  for (const kv::KvEvent& event : events) {
    const uint8_t bit = static_cast<uint8_t>(1u << static_cast<int>(event.tier));
    if (event.kind == kv::KvEvent::Kind::kStored) {
      auto& holders = holders_[event.block_hash];
      auto it = std::find_if(holders.begin(), holders.end(), [&](const Holder& h) { return h.slot == slot; });
      if (it == holders.end()) {
        holders.push_back(Holder{.slot = slot, .tier_mask = bit});
        worker.hashes.insert(event.block_hash);
      } else {
        it->tier_mask |= bit;
      }
      continue;
    }
    // kRemoved
    auto map_it = holders_.find(event.block_hash);
    if (map_it == holders_.end()) continue;
    auto& holders = map_it->second;
    auto it = std::find_if(holders.begin(), holders.end(), [&](const Holder& h) { return h.slot == slot; });
    if (it == holders.end()) continue;
    it->tier_mask &= static_cast<uint8_t>(~bit);
    if (it->tier_mask != 0) continue;
    holders.erase(it);
    worker.hashes.erase(event.block_hash);
    if (holders.empty()) holders_.erase(map_it);
  }
}

void GlobalPrefixIndex::RemoveWorker(std::string_view worker_id) {
  auto slot_it = slot_by_worker_.find(ToAbsl(worker_id));
  if (slot_it == slot_by_worker_.end()) return;
  const Slot slot = slot_it->second;
  WorkerEntry& worker = workers_[slot];
  for (const kv::BlockHash& hash : worker.hashes) {
    auto map_it = holders_.find(hash);
    if (map_it == holders_.end()) continue;
    auto& holders = map_it->second;
    holders.erase(std::remove_if(holders.begin(), holders.end(), [&](const Holder& h) { return h.slot == slot; }),
                  holders.end());
    if (holders.empty()) holders_.erase(map_it);
  }
  worker = WorkerEntry{};
  slot_by_worker_.erase(slot_it);
  free_slots_.push_back(slot);
}

absl::flat_hash_map<std::string, PrefixMatch> GlobalPrefixIndex::Match(
    std::span<const kv::BlockHash> prompt_hashes) const {
  absl::flat_hash_map<std::string, PrefixMatch> result;
  if (prompt_hashes.empty()) return result;
  auto first = holders_.find(prompt_hashes[0]);
  if (first == holders_.end()) return result;
  // Workers still matching, with their run so far. Each step keeps those that hold the
  // next block; the rest are final.
  struct Active {
    Slot slot;
    PrefixMatch match;
  };
  std::vector<Active> active;
  active.reserve(first->second.size());
  for (const Holder& holder : first->second) {
    Active a{.slot = holder.slot, .match = {}};
    a.match.num_blocks = 1;
    a.match.num_blocks_by_tier[BestTier(holder.tier_mask)] = 1;
    active.push_back(a);
  }
  auto finish = [&](const Active& a) { result.emplace(workers_[a.slot].worker_id, a.match); };
  for (size_t i = 1; i < prompt_hashes.size() && !active.empty(); ++i) {
    auto it = holders_.find(prompt_hashes[i]);
    if (it == holders_.end()) break;
    size_t kept = 0;
    for (Active& a : active) {
      const Holder* holder = nullptr;
      for (const Holder& h : it->second) {
        if (h.slot == a.slot) {
          holder = &h;
          break;
        }
      }
      if (holder == nullptr) {
        finish(a);
        continue;
      }
      ++a.match.num_blocks;
      ++a.match.num_blocks_by_tier[BestTier(holder->tier_mask)];
      active[kept++] = a;
    }
    active.resize(kept);
  }
  for (const Active& a : active) finish(a);
  return result;
}

PrefixMatch GlobalPrefixIndex::MatchWorker(std::span<const kv::BlockHash> prompt_hashes,
                                           std::string_view worker_id) const {
  PrefixMatch match;
  auto slot_it = slot_by_worker_.find(ToAbsl(worker_id));
  if (slot_it == slot_by_worker_.end()) return match;
  for (const kv::BlockHash& hash : prompt_hashes) {
    const Holder* holder = FindHolder(hash, slot_it->second);
    if (holder == nullptr) break;
    ++match.num_blocks;
    ++match.num_blocks_by_tier[BestTier(holder->tier_mask)];
  }
  return match;
}

int64_t GlobalPrefixIndex::num_blocks(std::string_view worker_id) const {
  auto it = slot_by_worker_.find(ToAbsl(worker_id));
  if (it == slot_by_worker_.end()) return 0;
  return static_cast<int64_t>(workers_[it->second].hashes.size());
}

std::vector<kv::KvEvent> GlobalPrefixIndex::WorkerBlocks(std::string_view worker_id, int64_t max_blocks) const {
  std::vector<kv::KvEvent> events;
  auto it = slot_by_worker_.find(ToAbsl(worker_id));
  if (it == slot_by_worker_.end() || max_blocks <= 0) return events;
  const Slot slot = it->second;
  for (const kv::BlockHash& hash : workers_[slot].hashes) {
    if (static_cast<int64_t>(events.size()) >= max_blocks) break;
    const Holder* holder = FindHolder(hash, slot);
    if (holder == nullptr) continue;  // NOTE: cannot happen (hashes mirrors holders_); skip rather than trust it
    for (int tier = 0; tier < kNumTiers && static_cast<int64_t>(events.size()) < max_blocks; ++tier) {
      if ((holder->tier_mask & (1u << tier)) == 0) continue;
      events.push_back(kv::KvEvent{.kind = kv::KvEvent::Kind::kStored,
                                   .block_hash = hash,
                                   .tier = static_cast<kv::Tier>(tier)});
    }
  }
  return events;
}

bool GlobalPrefixIndex::Contains(std::string_view worker_id, const kv::BlockHash& hash, kv::Tier tier) const {
  auto it = slot_by_worker_.find(ToAbsl(worker_id));
  if (it == slot_by_worker_.end()) return false;
  const Holder* holder = FindHolder(hash, it->second);
  return holder != nullptr && (holder->tier_mask & (1u << static_cast<int>(tier))) != 0;
}

}  // namespace kvmesh::cluster
