#include "worker/kv_transfer_metrics.h"

#include <string>
#include <string_view>
#include <vector>

#include "core/status_macros.h"
#include "metrics/buckets.h"

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
  KVMESH_ASSIGN_OR_RETURN(m->transfers_,
                          registry.AddCounterFamily("kvmesh_kv_transfers_total",
                                                    "KV transfers by transport and result (ok or the status code).",
                                                    {"direction", "transport", "result"}));
  KVMESH_ASSIGN_OR_RETURN(m->descriptors_,
                          registry.AddCounterFamily("kvmesh_kv_transfer_descriptors_total",
                                                    "Puts posted for KV transfers (one per layer and merged run).",
                                                    {"direction", "transport"}));
  KVMESH_ASSIGN_OR_RETURN(std::vector<double> run_buckets, metrics::ExponentialBuckets(1, 2, 12));
  KVMESH_ASSIGN_OR_RETURN(m->runs_, registry.AddHistogramFamily("kvmesh_kv_transfer_runs",
                                                                "Merged block runs per KV transfer.", run_buckets,
                                                                {"direction", "transport"}));
  KVMESH_ASSIGN_OR_RETURN(std::vector<double> gbps_buckets, metrics::ExponentialBuckets(0.125, 2, 12));
  KVMESH_ASSIGN_OR_RETURN(m->gbps_, registry.AddHistogramFamily("kvmesh_kv_transfer_gbps",
                                                                "Achieved GB/s of each KV transfer.", gbps_buckets,
                                                                {"direction", "transport"}));
  KVMESH_ASSIGN_OR_RETURN(std::vector<double> tail_buckets, metrics::ExponentialBuckets(0.0001, 2, 16));
  KVMESH_ASSIGN_OR_RETURN(m->tail_, registry.AddHistogram("kvmesh_kv_transfer_tail_seconds",
                                                          "Prompt computed to its KV acknowledged by the decode side.",
                                                          tail_buckets));
  return m;
}

void KvTransferMetrics::EndTransfer(Direction direction, Transport transport, int64_t descriptors, int64_t runs,
                                    const absl::Status& status, double gbps) {
  const std::string_view dir = direction == Direction::kSent ? "sent" : "received";
  const std::string_view tr = transport == Transport::kUcx ? "ucx" : "grpc";
  const std::string code = status.ok() ? "ok" : absl::StatusCodeToString(status.code());
  const std::string_view result = code;
  const std::string_view transfer_labels[] = {dir, tr, result};
  if (auto c = transfers_->WithLabels(transfer_labels); c.ok()) (*c)->Increment();
  const std::string_view labels[] = {dir, tr};
  if (descriptors > 0) {
    if (auto c = descriptors_->WithLabels(labels); c.ok()) (*c)->Increment(static_cast<double>(descriptors));
  }
  if (runs > 0) {
    if (auto h = runs_->WithLabels(labels); h.ok()) (*h)->Observe(static_cast<double>(runs));
  }
  if (gbps > 0) {
    if (auto h = gbps_->WithLabels(labels); h.ok()) (*h)->Observe(gbps);
  }
}

}  // namespace kvmesh::worker
