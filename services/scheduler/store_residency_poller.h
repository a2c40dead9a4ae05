// StoreResidencyPoller: keeps the registry's mirror of the cluster kv-stores
// (cluster/store_residency.h) current by reading each store's events
// (kv_store/store_events_reader.h) every poll_interval_ms, on a thread of its own.
//
// A store that cannot be read (dead, hung, partitioned) is forgotten once it has
// failed for forget_after_ms: placement then counts its blocks as misses, which is what
// the workers' own lookups will find. A store that restarted answers with a new epoch
// and a reset, and its previous life's blocks are dropped before its new ones count.
//
// Thread-safety: Start/Stop from one thread; the registry is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/worker_registry.h"
#include "kv_store/store_events_reader.h"
#include "metrics/registry.h"

namespace kvmesh::scheduler {

struct StoreResidencyPollerOptions {
  std::vector<std::string> addresses;  // host:port of every kv-store
  std::string api_key;                 // the stores' --api_keys; empty: none
  int64_t poll_interval_ms = 250;
  int64_t timeout_ms = 1'000;          // one Events call
  int64_t forget_after_ms = 3'000;     // failing this long: forgotten
  int32_t max_pages_per_round = 64;    // per store, so one store's snapshot cannot starve the others
};

class StoreResidencyPoller {
 public:
  // InvalidArgument for a malformed address, a duplicate, or a non-positive interval,
  // timeout, patience or page budget. Registers its counters in `metrics`.
  static absl::StatusOr<std::unique_ptr<StoreResidencyPoller>> Create(StoreResidencyPollerOptions options,
                                                                      cluster::WorkerRegistry& registry,
                                                                      metrics::Registry& metrics);
  ~StoreResidencyPoller();  // Stop()

  void Start();
  void Stop();
  // One round over every store, on the caller's thread (tests; the thread runs these).
  void PollOnce();

 private:
  struct Store {
    std::unique_ptr<kv_store::StoreEventsReader> reader;
    absl::Time last_ok = absl::InfinitePast();
    bool known = false;  // something of it is mirrored
  };
  StoreResidencyPoller(StoreResidencyPollerOptions options, cluster::WorkerRegistry& registry,
                       std::vector<Store> stores, metrics::Counter* resets, metrics::Counter* forgotten);
  void Poll(Store& store, absl::Time now);

  const StoreResidencyPollerOptions options_;
  cluster::WorkerRegistry& registry_;
  std::vector<Store> stores_;  // the poller thread's (or PollOnce's caller's)
  metrics::Counter* const resets_;
  metrics::Counter* const forgotten_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace kvmesh::scheduler
