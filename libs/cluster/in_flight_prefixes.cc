#include "cluster/in_flight_prefixes.h"

#include "core/status_macros.h"

namespace kvmesh::cluster {

void InFlightPrefixes::Note(std::string_view worker_id, std::span<const kv::BlockHash> hashes,
                            absl::Time deadline) {
  if (hashes.empty()) return;
  auto& blocks = by_worker_[std::string(worker_id)];
  for (const kv::BlockHash& hash : hashes) {
    auto [it, inserted] = blocks.try_emplace(hash, deadline);
    if (!inserted && it->second < deadline) it->second = deadline;
  }
}

void InFlightPrefixes::Apply(std::string_view worker_id, std::span<const kv::KvEvent> events, absl::Time now) {
  auto it = by_worker_.find(ToAbsl(worker_id));
  if (it == by_worker_.end()) return;
  auto& blocks = it->second;
  // Either kind settles the block: a stored one is indexed now, a removed one is gone.
  for (const kv::KvEvent& event : events) blocks.erase(event.block_hash);
  absl::erase_if(blocks, [now](const auto& entry) { return entry.second <= now; });
  if (blocks.empty()) by_worker_.erase(it);
}

void InFlightPrefixes::RemoveWorker(std::string_view worker_id) { by_worker_.erase(ToAbsl(worker_id)); }

int32_t InFlightPrefixes::LeadingRun(std::string_view worker_id, std::span<const kv::BlockHash> prompt_hashes,
                                     size_t from, absl::Time now) const {
  auto it = by_worker_.find(ToAbsl(worker_id));
  if (it == by_worker_.end()) return 0;
  int32_t run = 0;
  for (size_t i = from; i < prompt_hashes.size(); ++i) {
    auto block = it->second.find(prompt_hashes[i]);
    if (block == it->second.end() || block->second <= now) break;
    ++run;
  }
  return run;
}

int64_t InFlightPrefixes::num_entries() const {
  int64_t n = 0;
  for (const auto& [id, blocks] : by_worker_) n += static_cast<int64_t>(blocks.size());
  return n;
}

}  // namespace kvmesh::cluster
