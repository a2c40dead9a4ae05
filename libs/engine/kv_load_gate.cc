#include "engine/kv_load_gate.h"

#include <algorithm>
#include <chrono>
#include <cstddef>

#include "engine/scheduler.h"

namespace kvmesh::engine {

namespace {
// A fallback only: connectors answer every lookup (num_lookups_answered).
constexpr std::chrono::milliseconds kLookupRecheck{50};
}  // namespace

bool KvLoadGate::StillLookingUp(Sequence& seq) {
  if (!seq.lookup_answers_before.has_value()) return false;
  const auto now = std::chrono::steady_clock::now();
  if (kv_.lookups_answered() == *seq.lookup_answers_before && now - seq.lookup_checked_at < kLookupRecheck) {
    ++stats_.num_waiting_for_lookup;
    return true;
  }
  seq.lookup_answers_before.reset();
  return false;
}

bool KvLoadGate::StillLoading(Sequence& seq, int32_t* loaded_end) {
  if (seq.loading_block_hashes.empty()) return false;
  if (kv_.AnyLoading(seq.loading_block_hashes)) return true;
  *loaded_end = seq.disk_load_from + static_cast<int32_t>(seq.loading_block_hashes.size());
  seq.loading_block_hashes.clear();
  return false;
}

KvLoadGate::Verdict KvLoadGate::AfterLookup(Sequence& seq, kv::ComputedPrefix& prefix, int32_t loaded_end) {
  if (loaded_end > prefix.num_blocks()) {
    stats_.num_disk_blocks_lost += loaded_end - std::max(prefix.num_blocks(), seq.disk_load_from);
  }
  if (prefix.num_loadable_blocks <= 0 || prefix.num_blocks() <= seq.disk_load_from) {
    // NOTE: a connector still finding out (a remote lookup in flight) is waited for: its
    // answer, or its lookup's deadline, ends the wait (kv::KvConnectorMatch), and a hit
    // then saves the whole recompute.
    if (prefix.lookup_pending) {
      kv_.ReleasePrefix(prefix);
      ++stats_.num_waiting_for_lookup;
      seq.lookup_answers_before = lookup_answers_;
      seq.lookup_checked_at = std::chrono::steady_clock::now();
      return Verdict::kWait;
    }
    return Verdict::kAdmit;
  }
  // A load deferred for room among the load holds (kv/kv_tiers.h) holds nothing and
  // waits for the holders ahead of it to be admitted, which needs no room of its own.
  const bool first_load = !kv_.HasLoadHold(seq.kv_id);
  const kv::KvLoadStart load =
      first_load && first_loads_wait_ ? kv::KvLoadStart{.deferred = true} : kv_.StartLoads(seq.kv_id, prefix);
  if (load.deferred) {
    first_loads_wait_ = true;
    kv_.ReleasePrefix(prefix);
    ++stats_.num_disk_loads_deferred;
    return Verdict::kWait;
  }
  seq.disk_load_from = prefix.num_blocks();
  if (load.num_blocks <= 0) return Verdict::kAdmit;
  const auto first = static_cast<std::ptrdiff_t>(prefix.num_blocks());
  seq.loading_block_hashes.assign(prefix.block_hashes.begin() + first,
                                  prefix.block_hashes.begin() + first + load.num_blocks);
  kv_.ReleasePrefix(prefix);
  ++stats_.num_waiting_for_disk;
  return Verdict::kWait;
}

void KvLoadGate::Reset(Sequence& seq) {
  seq.disk_load_from = -1;
  seq.lookup_answers_before.reset();
}

}  // namespace kvmesh::engine
