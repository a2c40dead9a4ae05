// KvTransferMetrics: the Prometheus counters of a worker's KV transfers, next to the
// serving metrics (serving::ServingMetrics) on the worker's /metrics:
//
//   kvmesh_kv_transfer_bytes_total{direction="sent"|"received"}     KV payload bytes
//   kvmesh_kv_transfer_seconds_total{direction="sent"|"received"}   time push streams were open
//   kvmesh_kv_transfer_failures_total{direction="sent"|"received"}  push streams that ended in error
//
// "sent" is the prefill side (its PushKvBlocks client streams), "received" the decode
// side (its PushKvBlocks server streams).
//
// Thread-safety: thread-safe; Record* are lock-free.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "metrics/counter.h"
#include "metrics/registry.h"

namespace kvmesh::worker {

class KvTransferMetrics {
 public:
  // Registers the families in `registry` (which must outlive this). InvalidArgument when
  // they are already there.
  static absl::StatusOr<std::unique_ptr<KvTransferMetrics>> Create(metrics::Registry& registry);

  enum class Direction : uint8_t { kSent, kReceived };
  // Payload bytes: the receiver adds each accepted chunk's, the sender a stream's
  // written bytes when it ends (a failed stream's bytes count too).
  void AddBytes(Direction direction, int64_t bytes) { side(direction).bytes->Increment(bytes); }
  // A push stream ended after `seconds`; `ok` false counts a failure.
  void EndStream(Direction direction, double seconds, bool ok) {
    Side& s = side(direction);
    s.seconds->Increment(seconds);
    if (!ok) s.failures->Increment();
  }

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
};

}  // namespace kvmesh::worker
