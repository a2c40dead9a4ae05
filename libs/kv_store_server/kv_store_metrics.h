// KvStoreMetrics: the kv-store's /metrics (Prometheus text). The store's state and
// running totals are read from BlockStore::Stats() at scrape time:
//
//   kvmesh_kv_store_capacity_blocks, kvmesh_kv_store_slot_bytes     gauges: the pool
//   kvmesh_kv_store_blocks, kvmesh_kv_store_bytes                   gauges: committed
//   kvmesh_kv_store_intents                                         gauge: reserved, not yet put
//   kvmesh_kv_store_leases, kvmesh_kv_store_leased_blocks           gauges: live read leases
//   kvmesh_kv_store_lookups, _queried_blocks, _hit_blocks           gauges (since start)
//   kvmesh_kv_store_get_blocks, _get_bytes, _put_blocks, _put_bytes gauges (since start)
//   kvmesh_kv_store_evictions, _expired_intents, _checksum_failures gauges (since start)
//   kvmesh_kv_store_uptime_seconds                                  gauge
//   kvmesh_kv_store_epoch_info{epoch}                               gauge, 1: the epoch in hex
//   kvmesh_kv_store_requests_total{method,code}                     counter: calls by gRPC code
//
// NOTE: running totals are gauges read from the store, as the engine's are (one source
// of truth, no second count); use rate() or deriv() on them as on counters.
//
// Thread-safety: thread-safe.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kv_store/block_store.h"
#include "metrics/registry.h"

namespace kvmesh::kv_store {

class KvStoreMetrics {
 public:
  // Registers the families in `registry`; `registry` and `store` must outlive this, and
  // nothing may scrape `registry` once `store` is gone.
  static absl::StatusOr<std::unique_ptr<KvStoreMetrics>> Create(metrics::Registry& registry, BlockStore& store,
                                                               absl::Time started);

  // One finished call of `method` ("Lookup", "Put", ...).
  void CountRequest(std::string_view method, absl::StatusCode code);

 private:
  KvStoreMetrics() = default;

  metrics::CounterFamily* requests_ = nullptr;
};

}  // namespace kvmesh::kv_store
