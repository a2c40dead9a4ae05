// KvTransferMetrics: the Prometheus counters of a worker's KV transfers, next to the
// serving metrics (serving::ServingMetrics) on the worker's /metrics:
//
//   kvmesh_kv_transfer_bytes_total{direction="sent"|"received"}     KV payload bytes
//   kvmesh_kv_transfer_seconds_total{direction="sent"|"received"}   time push streams were open
//   kvmesh_kv_transfer_failures_total{direction="sent"|"received"}  push streams that ended in error
//   kvmesh_kv_transfers_total{direction, transport="ucx"|"grpc", result="ok"|<status code>}
//                                                                   transfers by transport and outcome
//                                                                   (failures by cause)
//   kvmesh_kv_transfer_descriptors_total{direction, transport}      puts posted (UCX: one per layer and run)
//   kvmesh_kv_transfer_runs{direction, transport}                   histogram: merged runs per transfer
//   kvmesh_kv_transfer_tail_seconds                                 histogram (prefill side): the prompt
//                                                                   computed -> the KV acknowledged on the
//                                                                   decode side (what overlap did not hide)
//   kvmesh_kv_transfer_gbps{direction, transport}                   histogram: achieved GB/s per transfer
//
// "sent" is the prefill side (its PushKvBlocks client streams), "received" the decode
// side (its PushKvBlocks server streams).
//
// Thread-safety: thread-safe; Record* are lock-free.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/status/status.h"
#include "metrics/counter.h"
#include "metrics/family.h"
#include "metrics/histogram.h"
#include "metrics/registry.h"

namespace kvmesh::worker {

class KvTransferMetrics {
 public:
  // Registers the families in `registry` (which must outlive this). InvalidArgument when
  // they are already there.
  static absl::StatusOr<std::unique_ptr<KvTransferMetrics>> Create(metrics::Registry& registry);

  enum class Direction : uint8_t { kSent, kReceived };
  enum class Transport : uint8_t { kUcx, kGrpc };
  // Payload bytes: the receiver adds each accepted chunk's, the sender a stream's
  // written bytes when it ends (a failed stream's bytes count too).
  void AddBytes(Direction direction, int64_t bytes) { side(direction).bytes->Increment(bytes); }
  // A push stream ended after `seconds`; `ok` false counts a failure.
  void EndStream(Direction direction, double seconds, bool ok) {
    Side& s = side(direction);
    s.seconds->Increment(seconds);
    if (!ok) s.failures->Increment();
  }
  // One transfer ended with `status`; `descriptors` and `runs` as KvTransferStats's (0
  // for the gRPC stream); `gbps` its achieved rate (<= 0: not observed).
  void EndTransfer(Direction direction, Transport transport, int64_t descriptors, int64_t runs,
                   const absl::Status& status, double gbps = 0);
  // Prefill side: the transfer tail of one prompt.
  void ObserveTail(double seconds) { tail_->Observe(seconds); }

 private:
  struct Side {
    metrics::Counter* bytes = nullptr;
    metrics::Counter* seconds = nullptr;
    metrics::Counter* failures = nullptr;
  };
  KvTransferMetrics() = default;
  Side& side(Direction d) { return d == Direction::kSent ? sent_ : received_; }

  Side sent_;
  Side received_;
  metrics::CounterFamily* transfers_ = nullptr;
  metrics::CounterFamily* descriptors_ = nullptr;
  metrics::HistogramFamily* runs_ = nullptr;
  metrics::HistogramFamily* gbps_ = nullptr;
  metrics::Histogram* tail_ = nullptr;
};

}  // namespace kvmesh::worker
