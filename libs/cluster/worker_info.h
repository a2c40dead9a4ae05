// What the scheduler knows about one worker: its registration (identity, role, model,
// KV-cache shape, capacity) and its last reported load. Plain values, no protobuf
// (services/scheduler converts from kvmesh.v1 messages).
//
// Thread-safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "kv/kv_connector.h"
#include "kv/kv_types.h"

namespace kvmesh::cluster {

// What a worker may be asked to do. Every worker can prefill its own requests; only
// kPrefill / kBoth workers take remote Prefill() calls, only kDecode / kBoth workers
// take Generate().
enum class WorkerRole : uint8_t { kPrefill, kDecode, kBoth };

// "prefill", "decode", "both".
std::string_view WorkerRoleName(WorkerRole role);
inline bool CanPrefill(WorkerRole role) { return role != WorkerRole::kDecode; }
inline bool CanDecode(WorkerRole role) { return role != WorkerRole::kPrefill; }

// The shape of a worker's paged KV cache. All live workers of one model must have equal
// specs but for tp_size: block hashes (block size, salt) and transferred blocks (layers,
// heads, dtype) are only comparable between equal specs, and a KV hand-off moves rank r
// to rank r, so placement pairs a prefill and a decode worker of equal tp_size only.
struct KvCacheSpec {
  int32_t block_size_tokens = kv::kDefaultBlockSizeTokens;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;  // of the model, before TP sharding
  int32_t head_dim = 0;
  DType dtype = DType::kBF16;
  int32_t tp_size = 1;
  uint64_t block_hash_salt = 0;  // kv/block_hash.h's salt

  bool operator==(const KvCacheSpec&) const = default;
  // InvalidArgument naming the field: block_size_tokens and tp_size >= 1, others >= 0.
  absl::Status Validate() const;
  // "block_size=16 layers=32 kv_heads=8 head_dim=128 dtype=bf16 tp=2 salt=0x0".
  std::string DebugString() const;
};

// How KV may move into or out of a worker (prefill -> decode). A worker without the
// set (an older one) moves it over the gRPC stream only.
struct KvTransportSet {
  bool grpc_stream = true;  // Worker.PushKvBlocks
  bool ucx = false;         // one-sided UCX puts (libs/kv/transport/ucx)
  bool operator==(const KvTransportSet&) const = default;
};

// The transport of one hand-off.
enum class KvTransportKind : uint8_t { kGrpcStream, kUcx };

// Limits a worker reported at registration; 0 = unknown.
struct WorkerCapacity {
  int32_t max_num_seqs = 0;
  int32_t max_num_batched_tokens = 0;
  int32_t max_model_len = 0;
};

// A worker's load as of its last heartbeat.
struct WorkerLoad {
  int32_t num_running_seqs = 0;
  int32_t num_waiting_seqs = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_cached = 0;
  int32_t queue_depth = 0;  // received, not yet handed to the engine
  // Measured speeds, for weighing a lower-tier prefix hit against recomputing it
  // (placement_policy.h). 0: not measured yet (no onboard / prefill since start).
  double kv_host_read_bytes_per_second = 0;  // host tier -> device, whole blocks
  double kv_disk_read_bytes_per_second = 0;  // disk tier -> host
  double kv_store_read_bytes_per_second = 0;  // cluster kv-store -> host
  double prefill_tokens_per_second = 0;      // prompt tokens computed per second of prefill

  // kv_blocks_used / kv_blocks_total in [0, 1]; 0 when the total is unknown.
  double kv_usage() const;
  // Requests waiting anywhere on the worker (engine queue + receive queue).
  int32_t num_pending() const { return num_waiting_seqs + queue_depth; }
};

struct WorkerRegistration {
  std::string worker_id;  // unique, stable across restarts
  std::string address;    // host:port of its Worker service
  WorkerRole role = WorkerRole::kBoth;
  std::string model;
  KvCacheSpec kv_cache_spec;
  WorkerCapacity capacity;
  KvTransportSet kv_transports;
  // Its kv-store key spaces (kv::KvConnector::shared_key_space): a block the stores
  // hold under every one of them is loadable here. Empty: no kv-store.
  std::vector<kv::SharedKeySpace> kv_store_key_spaces;

  // InvalidArgument for an empty id, address or model, or a bad spec.
  absl::Status Validate() const;
};

// A consistent copy of one live worker's state.
struct WorkerSnapshot {
  WorkerRegistration registration;
  WorkerLoad load;
  absl::Time registered_at = absl::InfinitePast();
  absl::Time last_heartbeat_at = absl::InfinitePast();
  bool draining = false;
  // Requests placed on it since its last heartbeat (load it has not reported yet).
  int32_t num_recent_placements = 0;
  int64_t num_indexed_blocks = 0;  // distinct hashes the prefix index holds for it
  // A peer reported it unreachable (WorkerRegistry::ReportUnreachable): no placements
  // until then, or until it registers again.
  absl::Time unreachable_until = absl::InfinitePast();
};

}  // namespace kvmesh::cluster
