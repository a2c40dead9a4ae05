// The kv-store's flags (kvmesh-kv-store and `kvmesh kv-store`), parsed into
// KvStoreServerOptions in one place, and the serve-until-SIGTERM loop both run.
//
// Defined here: --capacity_bytes, --capacity_blocks, --block_bytes, --lease_ms,
// --max_lease_ms, --intent_timeout_ms, --shutdown_grace_ms. Declared here and defined by
// each binary (the kvmesh CLI shares them with its other commands): --listen,
// --metrics_port, --api_keys. --help lists this file as "kv_store_flags".
//
// Thread-safety: call from main(), after flag parsing.
#pragma once

#include "absl/status/statusor.h"
#include "kv_store_server/kv_store_server.h"

namespace kvmesh::kv_store {

inline constexpr char kKvStoreFlagsFile[] = "kv_store_flags";

// InvalidArgument naming the flag: neither or both of --capacity_bytes and
// --capacity_blocks, no --block_bytes, a capacity of less than one block, or
// --max_lease_ms < --lease_ms.
absl::StatusOr<KvStoreServerOptions> KvStoreServerOptionsFromFlags();

// Starts the server, serves until SIGTERM / SIGINT (BlockStopSignals must have run
// before any thread started), drains for options.shutdown_grace_ms and returns the
// exit status: 0, or 1 when it could not start (the reason on stderr, naming `program`).
int ServeKvStoreUntilStopped(const char* program, const KvStoreServerOptions& options);

}  // namespace kvmesh::kv_store
