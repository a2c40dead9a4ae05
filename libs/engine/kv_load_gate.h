// KvLoadGate: the one "waiting for KV" state of a waiting sequence, whatever the source
// of the KV below the host tier (the disk tier, the cluster kv-store: kv/kv_connector.h).
// The scheduler asks it twice per waiting sequence and step, around the prefix lookup:
//
//   1. StillLoading(seq)         the sequence waits for a load it started: keep waiting
//                                while any of its blocks is in flight (it holds no
//                                tier-0 block, so the wait cannot deadlock anyone);
//   2. AfterLookup(seq, prefix)  the lookup found blocks a connector holds (start their
//                                load and wait), or a connector is still finding out (wait
//                                until it knows: its deadline bounds that), or the load was deferred for
//                                room among the load holds (wait): kWait, with the prefix
//                                released. Else kAdmit: go on with the prefix.
//
// Each load begins past the last one's start (Sequence::disk_load_from): what is gone
// again by then is recomputed, so the wait always ends; a load cut short (host tier
// full) continues where the first one ended instead of recomputing the rest. Once a
// first load waits for room among the load holds, later first loads in the same pass
// wait too: the room that frees goes to the oldest waiter, so a large load is not
// starved by smaller ones behind it.
//
// A sequence waiting for a lookup is looked up again only when some connector answered
// one since (KvConnector::num_lookups_answered), or after kLookupRecheck: a prompt's
// lookup walks every tier, and a step with nothing else to do comes every few ms.
//
// Thread-safety: not thread-safe; owned by the Scheduler (engine thread).
#pragma once

#include <cstdint>

#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"

namespace kvmesh::engine {

struct SchedulerStats;

class KvLoadGate {
 public:
  enum class Verdict : uint8_t { kAdmit, kWait };

  // `kv` and `stats` must outlive this.
  KvLoadGate(kv::KvCacheManager& kv, SchedulerStats& stats) : kv_(kv), stats_(stats) {}

  // A new pass over the waiting queue.
  void BeginPass() {
    first_loads_wait_ = false;
    lookup_answers_ = kv_.lookups_answered();  // before any of this pass's lookups
  }
  // Whether `seq` still waits for a connector's lookup that has not been answered: no
  // answer came since its last lookup said pending (and kLookupRecheck has not passed).
  // Then it is not looked up again this step.
  bool StillLookingUp(Sequence& seq);
  // Whether `seq` still waits for blocks in flight. When its load has finished, sets
  // *loaded_end past the blocks it read (else leaves it).
  bool StillLoading(Sequence& seq, int32_t* loaded_end);
  // After `seq`'s lookup `prefix` (loaded_end from StillLoading, or -1). kWait releases
  // the prefix.
  Verdict AfterLookup(Sequence& seq, kv::ComputedPrefix& prefix, int32_t loaded_end);
  // `seq` leaves the waiting queue or starts over (admitted, preempted, ended).
  static void Reset(Sequence& seq);

 private:
  kv::KvCacheManager& kv_;
  SchedulerStats& stats_;
  bool first_loads_wait_ = false;
  uint64_t lookup_answers_ = 0;  // as of BeginPass
};

}  // namespace kvmesh::engine
