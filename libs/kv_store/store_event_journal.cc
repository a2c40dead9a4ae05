#include "kv_store/store_event_journal.h"

#include <algorithm>

namespace kvmesh::kv_store {

StoreEventJournal::StoreEventJournal(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void StoreEventJournal::Append(const StoreKey& key, bool removed) {
  if (events_.size() == capacity_) events_.pop_front();
  events_.push_back(StoreEvent{.sequence = next_sequence_++, .key = key, .removed = removed});
}

bool StoreEventJournal::Covers(uint64_t after) const {
  if (after > last_sequence()) return false;
  // The oldest retained change must be the one right after `after` (or nothing is missing).
  const uint64_t oldest = events_.empty() ? next_sequence_ : events_.front().sequence;
  return after + 1 >= oldest;
}

std::vector<StoreEvent> StoreEventJournal::After(uint64_t after, size_t max) const {
  std::vector<StoreEvent> out;
  if (events_.empty() || after >= last_sequence()) return out;
  const size_t first = static_cast<size_t>(after + 1 - events_.front().sequence);
  const size_t count = std::min(max, events_.size() - first);
  out.assign(events_.begin() + static_cast<std::ptrdiff_t>(first),
             events_.begin() + static_cast<std::ptrdiff_t>(first + count));
  return out;
}

}  // namespace kvmesh::kv_store
