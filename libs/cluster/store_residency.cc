#include "cluster/store_residency.h"

#include <string>

#include "core/status_macros.h"

namespace kvmesh::cluster {

bool StoreResidency::Apply(std::string_view address, const kv_store::StoreEventsPage& page) {
  Store& store = stores_[std::string(address)];
  // A page of another epoch than the one mirrored is a reset whatever it says: what the
  // store's previous life held is gone.
  const bool reset = page.reset || store.epoch != page.epoch;
  if (reset) Clear(store);
  store.epoch = page.epoch;
  for (const kv_store::StoreEvent& event : page.events) {
    if (event.removed) {
      Remove(store, event.key);
    } else {
      Add(store, event.key);
    }
  }
  return reset;
}

void StoreResidency::Forget(std::string_view address) {
  auto it = stores_.find(ToAbsl(address));
  if (it == stores_.end()) return;
  Clear(it->second);
  stores_.erase(it);
}

int32_t StoreResidency::Matcher::LeadingRun(std::span<const kv::SharedKeySpace> spaces, size_t first) {
  if (spaces.empty() || residency_.holders_.empty()) return 0;
  for (const kv::SharedKeySpace& space : spaces) {
    auto [it, added] = held_.try_emplace(space);
    if (!added) continue;
    const kv_store::StoreKeySpace keys = kv_store::StoreKeySpace::FromId(space);
    it->second.reserve(hashes_.size());
    for (const kv::BlockHash& hash : hashes_) it->second.push_back(residency_.holders_.contains(keys.Key(hash)) ? 1 : 0);
  }
  int32_t run = 0;
  for (size_t i = first; i < hashes_.size(); ++i) {
    for (const kv::SharedKeySpace& space : spaces) {
      if (held_.at(space)[i] == 0) return run;
    }
    ++run;
  }
  return run;
}

int64_t StoreResidency::num_blocks(std::string_view address) const {
  auto it = stores_.find(ToAbsl(address));
  return it == stores_.end() ? 0 : static_cast<int64_t>(it->second.keys.size());
}

uint64_t StoreResidency::epoch(std::string_view address) const {
  auto it = stores_.find(ToAbsl(address));
  return it == stores_.end() ? 0 : it->second.epoch;
}

void StoreResidency::Add(Store& store, const kv_store::StoreKey& key) {
  if (store.keys.insert(key).second) ++holders_[key];
}

void StoreResidency::Remove(Store& store, const kv_store::StoreKey& key) {
  if (store.keys.erase(key) == 0) return;
  auto it = holders_.find(key);
  if (--it->second == 0) holders_.erase(it);
}

void StoreResidency::Clear(Store& store) {
  for (const kv_store::StoreKey& key : store.keys) {
    auto it = holders_.find(key);
    if (--it->second == 0) holders_.erase(it);
  }
  store.keys.clear();
}

int32_t StoreResidency::LeadingRun(std::span<const kv::SharedKeySpace> spaces, std::span<const kv::BlockHash> hashes,
                                   size_t first) const {
  return Matcher(*this, hashes).LeadingRun(spaces, first);
}

}  // namespace kvmesh::cluster
