// WorkerRegistry: the scheduler's view of the cluster. Workers Register, then
// Heartbeat with their load and KV events; a worker whose last heartbeat is older than
// the lease TTL is expired (dropped with its prefix-index entries) and must Register
// again. The registry owns the GlobalPrefixIndex, so a placement sees workers and
// their cached blocks consistently.
//
// Expiry is lazy (every call first drops the workers whose lease ended, by the
// injected clock) and may be driven by ExpireStale() from a sweeper to log it.
//
// Thread-safety: thread-safe. All state sits under one mutex; no callback runs under it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/in_flight_prefixes.h"
#include "cluster/store_residency.h"
#include "cluster/prefix_index.h"
#include "cluster/worker_info.h"
#include "core/clock.h"
#include "kv/kv_types.h"

namespace kvmesh::cluster {

struct WorkerRegistryOptions {
  int64_t heartbeat_interval_ms = 1'000;  // what workers are told to use
  int64_t worker_ttl_ms = 5'000;          // a lease lasts this long past the last heartbeat
  Clock* clock = nullptr;                 // nullptr: Clock::Real(); must outlive the registry
  // A worker a peer reported unreachable gets no placements for this long (or until it
  // registers again): long enough for its lease to expire if it is dead, short enough
  // that a partition that heals costs little.
  int64_t unreachable_ttl_ms = 10'000;
  // A placed prompt's blocks count as held by its worker (PrefixMatch::num_blocks_in_flight)
  // until the worker reports them, or for this long (cluster/in_flight_prefixes.h): long
  // enough to cover a long prompt's queueing and prefill on a busy worker. 0: off.
  int64_t in_flight_prefix_ttl_ms = 30'000;
};

// One heartbeat's report.
struct HeartbeatReport {
  WorkerLoad load;
  std::vector<kv::KvEvent> kv_events;  // since the previous heartbeat, in order
  // kv_events is the worker's complete block set: forget what was known first.
  bool kv_events_snapshot = false;
  bool draining = false;  // no new placements
};

// What the registry holds right now, for metrics.
struct RegistryStats {
  int32_t num_prefill_workers = 0;  // live workers by role (draining ones included)
  int32_t num_decode_workers = 0;
  int32_t num_both_workers = 0;
  int32_t num_draining_workers = 0;
  int64_t num_indexed_hashes = 0;   // distinct block hashes in the global prefix index
  int64_t num_store_keys = 0;       // distinct keys the cluster kv-stores hold (StoreResidency)
  int64_t num_expired_total = 0;    // workers dropped for missing heartbeats, since start
};

// A live worker of the requested model with its match against a prompt: the indexed
// leading run, continued by the blocks a request placed on it is computing
// (prefix.num_blocks_in_flight, counted in prefix.num_blocks), then by the blocks the
// cluster kv-stores hold under its key spaces (prefix.num_blocks_by_tier[kStore]).
struct WorkerCandidate {
  WorkerSnapshot worker;
  PrefixMatch prefix;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(const WorkerRegistryOptions& options = {});
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Adds the worker, or replaces a live one with the same id (a restart: its indexed
  // blocks are forgotten, the worker reports them again). InvalidArgument for a bad
  // registration; FailedPrecondition if its KV-cache spec differs from the other live
  // workers of its model.
  absl::Status Register(const WorkerRegistration& registration) ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the worker's lease, records its load and applies its KV events. NotFound for
  // an unknown or expired worker (it must Register again).
  absl::Status Heartbeat(std::string_view worker_id, const HeartbeatReport& report) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the worker now. NotFound if unknown.
  absl::Status Deregister(std::string_view worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // A peer could not reach the worker named by `worker_id`, or else by `address`
  // (refused, reset, no keepalive answer): it receives no placements for
  // unreachable_ttl_ms, though its lease stands (the scheduler may still hear it).
  // Returns the worker's id; NotFound when no live worker matches, InvalidArgument when
  // both are empty.
  absl::StatusOr<std::string> ReportUnreachable(std::string_view worker_id, std::string_view address)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the workers whose lease has ended; returns their ids.
  std::vector<std::string> ExpireStale() ABSL_LOCKS_EXCLUDED(mu_);

  // Live workers (of `model`, or all when empty), ordered by worker id.
  std::vector<WorkerSnapshot> List(std::string_view model = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Up to `max_blocks` of the live worker's indexed blocks (GlobalPrefixIndex::WorkerBlocks);
  // empty for an unknown worker.
  std::vector<kv::KvEvent> IndexedBlocks(std::string_view worker_id, int64_t max_blocks) ABSL_LOCKS_EXCLUDED(mu_);

  // The KV-cache spec the live workers of `model` share. Unavailable when none is live.
  absl::StatusOr<KvCacheSpec> ModelKvCacheSpec(std::string_view model) ABSL_LOCKS_EXCLUDED(mu_);

  // The live, non-draining, not reported unreachable workers of `model` not in
  // `exclude_worker_ids`, each with its
  // leading match against `prompt_hashes`, ordered by worker id.
  std::vector<WorkerCandidate> Candidates(std::string_view model, std::span<const kv::BlockHash> prompt_hashes,
                                          std::span<const std::string> exclude_worker_ids = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Counts a request placed on the worker as load until its next heartbeat (heartbeats
  // lag: without this, a burst would all go to the worker that looked idlest), and the
  // prompt's blocks (`prompt_hashes`) the worker does not hold yet as in flight on it
  // (in_flight_prefix_ttl_ms). No-op for an unknown worker.
  void NotePlacement(std::string_view worker_id, std::span<const kv::BlockHash> prompt_hashes = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Mirrors a kv-store's residency (cluster/store_residency.h): one page its events
  // reader read. Returns true when it replaced what was known of the store.
  bool ApplyStoreEvents(std::string_view address, const kv_store::StoreEventsPage& page) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a store that could not be read: its blocks count as misses.
  void ForgetStore(std::string_view address) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks mirrored for the store (0 when unknown).
  int64_t num_store_blocks(std::string_view address) const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t heartbeat_interval_ms() const { return options_.heartbeat_interval_ms; }
  int64_t worker_ttl_ms() const { return options_.worker_ttl_ms; }
  int32_t num_workers() const ABSL_LOCKS_EXCLUDED(mu_);
  // As of the last call that expired workers (no expiry runs here).
  RegistryStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct WorkerState {
    WorkerSnapshot snapshot;  // num_indexed_blocks is filled on copy-out
  };

  std::vector<std::string> ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerSnapshot SnapshotLocked(const WorkerState& state) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const WorkerRegistryOptions options_;
  const absl::Duration ttl_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  GlobalPrefixIndex index_ ABSL_GUARDED_BY(mu_);
  InFlightPrefixes in_flight_ ABSL_GUARDED_BY(mu_);
  StoreResidency store_ ABSL_GUARDED_BY(mu_);
  int64_t num_expired_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvmesh::cluster
