#include "kv_store_server/kv_store_flags.h"

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/flag_checks.h"
#include "core/logging.h"
#include "core/stop_signals.h"

// Defined by each binary: services/kv_store/main.cc; in the kvmesh CLI the worker's
// (--listen, --metrics_port) and serve's (--api_keys).
ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(int32_t, metrics_port);
ABSL_DECLARE_FLAG(std::string, api_keys);

ABSL_FLAG(int64_t, capacity_bytes, 0,
          "Host memory for blocks, in bytes (rounded down to whole --block_bytes slots, allocated at start); "
          "give this or --capacity_blocks");
KVMESH_FLAG_RANGE(capacity_bytes, 0, 1LL << 50);
ABSL_FLAG(int64_t, capacity_blocks, 0, "Block slots, allocated at start; give this or --capacity_bytes");
KVMESH_FLAG_RANGE(capacity_blocks, 0, (1LL << 31) - 1);
ABSL_FLAG(int64_t, block_bytes, 0,
          "Bytes of one slot: the largest block a put may declare (one TP rank's shard of a block, every layer). "
          "Required");
KVMESH_FLAG_RANGE(block_bytes, 0, 1LL << 30);
ABSL_FLAG(int64_t, lease_ms, 5000, "Length of the read lease a lookup grants; leases are never extended");
KVMESH_FLAG_RANGE(lease_ms, 1, 3'600'000);
ABSL_FLAG(int64_t, max_lease_ms, 30000,
          "Longest a block stays protected by leases in a row, however often it is looked up; then it is "
          "evictable for --lease_ms");
KVMESH_FLAG_RANGE(max_lease_ms, 1, 86'400'000);
ABSL_FLAG(int64_t, intent_timeout_ms, 10000,
          "A put intent whose block is not put within this long expires and its slot returns to the pool");
KVMESH_FLAG_RANGE(intent_timeout_ms, 1, 3'600'000);
ABSL_FLAG(std::string, data_plane, "grpc",
          "How block bytes move: grpc (inside the Put and Get streams) or ucx (one-sided UCX transfers into and "
          "out of the registered slot memory for clients that ask, the gRPC stream for the rest)");
ABSL_FLAG(std::string, data_plane_ucx_tls, "",
          "UCX_TLS of the ucx data plane (e.g. \"sm\", \"tcp\"); empty: the UCX_TLS environment variable, else "
          "UCX's choice");
ABSL_FLAG(bool, data_plane_cma_gets, false,
          "With --data_plane=ucx, a get on this host writes the blocks straight into the reader's process "
          "(cross-memory attach into the pid its lease names) instead of the reader pulling them through UCX. That "
          "pid comes from the client and is not verified: turn on only where every client is trusted");
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000, "On SIGTERM, how long running calls may take to finish");
KVMESH_FLAG_RANGE(shutdown_grace_ms, 0, 86'400'000);

namespace kvmesh::kv_store {

absl::StatusOr<KvStoreServerOptions> KvStoreServerOptionsFromFlags() {
  KvStoreServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    o.api_keys.emplace_back(key);
  }
  o.shutdown_grace_ms = absl::GetFlag(FLAGS_shutdown_grace_ms);
  const int64_t block_bytes = absl::GetFlag(FLAGS_block_bytes);
  const int64_t capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
  const int64_t capacity_blocks = absl::GetFlag(FLAGS_capacity_blocks);
  // NOTE: the slot size is fixed at start, not by the first PutIntent: a store's
  // capacity is then known (and allocated) before it serves, and a put of another model
  // with larger blocks is refused instead of silently fixing the store to it.
  if (block_bytes <= 0) return absl::InvalidArgumentError("--block_bytes is required (the slot size in bytes)");
  if ((capacity_bytes > 0) == (capacity_blocks > 0)) {
    return absl::InvalidArgumentError("give one of --capacity_bytes and --capacity_blocks");
  }
  o.store.slot_bytes = block_bytes;
  o.store.capacity_blocks = capacity_blocks > 0 ? capacity_blocks : capacity_bytes / block_bytes;
  if (o.store.capacity_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--capacity_bytes=", capacity_bytes,
                                                   " holds no block of --block_bytes=", block_bytes));
  }
  const std::string data_plane = absl::GetFlag(FLAGS_data_plane);
  if (data_plane != "grpc" && data_plane != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("--data_plane=", data_plane, ": must be grpc or ucx"));
  }
  o.ucx_data_plane = data_plane == "ucx";
  o.ucx.tls = absl::GetFlag(FLAGS_data_plane_ucx_tls);
  o.ucx.cma_into_readers = absl::GetFlag(FLAGS_data_plane_cma_gets);
  o.store.lease_ms = absl::GetFlag(FLAGS_lease_ms);
  o.store.max_lease_ms = absl::GetFlag(FLAGS_max_lease_ms);
  o.store.intent_timeout_ms = absl::GetFlag(FLAGS_intent_timeout_ms);
  if (o.store.max_lease_ms < o.store.lease_ms) {
    return absl::InvalidArgumentError(absl::StrCat("--max_lease_ms=", o.store.max_lease_ms,
                                                   " must be at least --lease_ms=", o.store.lease_ms));
  }
  return o;
}

int ServeKvStoreUntilStopped(const char* program, const KvStoreServerOptions& options) {
  absl::StatusOr<std::unique_ptr<KvStoreServer>> server = KvStoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, server.status().ToString().c_str());
    return 1;
  }
  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "kv-store shutting down" << LogKv("signal", signal)
                    << LogKv("grace_ms", options.shutdown_grace_ms);
  (*server)->Shutdown(options.shutdown_grace_ms);
  server->reset();
  KVMESH_LOG(kInfo) << "kv-store stopped";
  return 0;
}

}  // namespace kvmesh::kv_store
