// InFlightPrefixes: the KV blocks a worker is about to compute because a prompt was just
// placed on it, before its KV events say so.
//
// A worker reports a block only after its prefill computed it and the next heartbeat
// carried the event: seconds, for a long prompt on a busy worker. Without this record a
// second request with the same prefix arriving in that window finds no holder anywhere,
// so cache-aware placement sends it by load (usually to the *other* worker, the first one
// being busy with the prefill), the prefix is computed and cached on both, and from then
// on the two copies halve the cache for every tenant that got split this way (SGLang's
// router inserts a routed prompt into its tree at routing time for the same reason).
//
// A placed prompt's full-block hashes are recorded for its worker until the worker
// reports them stored (they are in the GlobalPrefixIndex then), reports them removed, or
// the deadline passes (the request failed, was aborted or is still queued: the record
// then stops steering requests to a worker that may never hold them). Blocks the worker
// already holds per the index are not recorded, so a later eviction of them is seen at
// once.
//
// Memory: one hash-map entry per (worker, recorded block not yet reported).
//
// Thread-safety: not thread-safe; owned by WorkerRegistry under its lock.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "kv/kv_types.h"

namespace kvmesh::cluster {

class InFlightPrefixes {
 public:
  InFlightPrefixes() = default;
  InFlightPrefixes(const InFlightPrefixes&) = delete;
  InFlightPrefixes& operator=(const InFlightPrefixes&) = delete;

  // Records `hashes` (a placed prompt's chained full-block hashes from block `from` on,
  // the first `from` being held already) as being computed by the worker until
  // `deadline`. A hash already recorded gets the later of the two deadlines.
  void Note(std::string_view worker_id, std::span<const kv::BlockHash> hashes, absl::Time deadline);

  // The worker reported these events: stored blocks are indexed now, removed ones are
  // gone; both stop being in flight. Also drops the worker's records past their deadline.
  void Apply(std::string_view worker_id, std::span<const kv::KvEvent> events, absl::Time now);

  // Forgets the worker (it left, expired, restarted or sent a snapshot).
  void RemoveWorker(std::string_view worker_id);

  // How many of `prompt_hashes`, starting at index `from`, are recorded for the worker
  // with a deadline after `now`, as a leading run (stops at the first that is not).
  int32_t LeadingRun(std::string_view worker_id, std::span<const kv::BlockHash> prompt_hashes, size_t from,
                     absl::Time now) const;

  // Recorded (worker, block) entries, expired ones included until the worker's next Apply.
  int64_t num_entries() const;

 private:
  absl::flat_hash_map<std::string, absl::flat_hash_map<kv::BlockHash, absl::Time>> by_worker_;
};

}  // namespace kvmesh::cluster
