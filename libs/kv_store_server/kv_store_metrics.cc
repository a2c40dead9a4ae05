#include "kv_store_server/kv_store_metrics.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace kvmesh::kv_store {

absl::StatusOr<std::unique_ptr<KvStoreMetrics>> KvStoreMetrics::Create(metrics::Registry& registry, BlockStore& store,
                                                                     absl::Time started) {
  std::unique_ptr<KvStoreMetrics> m(new KvStoreMetrics());
  BlockStore* s = &store;
  struct GaugeSpec {
    const char* name;
    const char* help;
    int64_t BlockStoreStats::*field;
  };
  const GaugeSpec gauges[] = {
      {"kvmesh_kv_store_capacity_blocks", "Block slots of the pool.", &BlockStoreStats::capacity_blocks},
      {"kvmesh_kv_store_slot_bytes", "Bytes of one slot: the largest block the store holds.",
       &BlockStoreStats::slot_bytes},
      {"kvmesh_kv_store_blocks", "Committed blocks.", &BlockStoreStats::num_blocks},
      {"kvmesh_kv_store_bytes", "Bytes of the committed blocks.", &BlockStoreStats::num_bytes},
      {"kvmesh_kv_store_intents", "Put intents reserved and not yet committed or expired.",
       &BlockStoreStats::num_intents},
      {"kvmesh_kv_store_leases", "Live read leases.", &BlockStoreStats::num_leases},
      {"kvmesh_kv_store_leased_blocks", "Blocks protected from eviction by a live lease.",
       &BlockStoreStats::num_leased_blocks},
      {"kvmesh_kv_store_lookups", "Lookup calls (since start).", &BlockStoreStats::lookups},
      {"kvmesh_kv_store_queried_blocks", "Keys asked by lookups (since start).", &BlockStoreStats::queried_blocks},
      {"kvmesh_kv_store_hit_blocks", "Keys found by lookups, in their leading run (since start).",
       &BlockStoreStats::hit_blocks},
      {"kvmesh_kv_store_get_blocks", "Blocks read by Get (since start).", &BlockStoreStats::get_blocks},
      {"kvmesh_kv_store_get_bytes", "Bytes read by Get (since start).", &BlockStoreStats::get_bytes},
      {"kvmesh_kv_store_put_blocks", "Blocks committed by Put (since start).", &BlockStoreStats::put_blocks},
      {"kvmesh_kv_store_put_bytes", "Bytes committed by Put (since start).", &BlockStoreStats::put_bytes},
      {"kvmesh_kv_store_evictions", "Committed blocks evicted to make room (since start).",
       &BlockStoreStats::evictions},
      {"kvmesh_kv_store_expired_intents", "Put intents that expired before their block was put (since start).",
       &BlockStoreStats::expired_intents},
      {"kvmesh_kv_store_checksum_failures",
       "Puts refused because the bytes did not match their checksum (since start).",
       &BlockStoreStats::checksum_failures},
  };
  for (const GaugeSpec& spec : gauges) {
    auto read = [s, field = spec.field] { return static_cast<double>(s->Stats().*field); };
    KVMESH_RETURN_IF_ERROR(registry.AddCallbackGauge(spec.name, spec.help, std::move(read)).status());
  }
  KVMESH_RETURN_IF_ERROR(registry
                             .AddCallbackGauge("kvmesh_kv_store_uptime_seconds", "Seconds since the store started.",
                                               [started] { return absl::ToDoubleSeconds(absl::Now() - started); })
                             .status());
  KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGaugeFamily * epoch,
                          registry.AddCallbackGaugeFamily(
                              "kvmesh_kv_store_epoch_info",
                              "1, labelled with the store's epoch in hex (random at start, new on every restart).",
                              {"epoch"}));
  const std::string hex = absl::StrFormat("%016x", store.epoch());
  KVMESH_ASSIGN_OR_RETURN(metrics::CallbackGauge * epoch_gauge, epoch->WithLabels({std::string_view(hex)}));
  epoch_gauge->SetCallback([] { return 1.0; });
  KVMESH_ASSIGN_OR_RETURN(m->requests_,
                          registry.AddCounterFamily("kvmesh_kv_store_requests",
                                                    "kvmesh.v1.KvStore calls by method and gRPC status code.",
                                                    {"method", "code"}));
  return m;
}

void KvStoreMetrics::CountRequest(std::string_view method, absl::StatusCode code) {
  const std::string name = absl::StatusCodeToString(code);
  if (auto c = requests_->WithLabels({method, std::string_view(name)}); c.ok()) (*c)->Increment();
}

}  // namespace kvmesh::kv_store
