#include "worker/kv_transfer_metrics.h"

#include "core/status_macros.h"

namespace kvmesh::worker {

absl::StatusOr<std::unique_ptr<KvTransferMetrics>> KvTransferMetrics::Create(metrics::Registry& registry) {
  std::unique_ptr<KvTransferMetrics> m(new KvTransferMetrics());
  KVMESH_ASSIGN_OR_RETURN(metrics::CounterFamily * bytes,
                          registry.AddCounterFamily("kvmesh_kv_transfer_bytes_total",
                                                    "KV cache bytes transferred between workers.", {"direction"}));
  KVMESH_ASSIGN_OR_RETURN(metrics::CounterFamily * seconds,
                          registry.AddCounterFamily("kvmesh_kv_transfer_seconds_total",
                                                    "Time KV push streams were open.", {"direction"}));
  KVMESH_ASSIGN_OR_RETURN(metrics::CounterFamily * failures,
                          registry.AddCounterFamily("kvmesh_kv_transfer_failures_total",
                                                    "KV push streams that ended in an error.", {"direction"}));
  for (auto [side, label] : {std::pair{&m->sent_, "sent"}, std::pair{&m->received_, "received"}}) {
    KVMESH_ASSIGN_OR_RETURN(side->bytes, bytes->WithLabels({label}));
    KVMESH_ASSIGN_OR_RETURN(side->seconds, seconds->WithLabels({label}));
    KVMESH_ASSIGN_OR_RETURN(side->failures, failures->WithLabels({label}));
  }
  return m;
}

}  // namespace kvmesh::worker
