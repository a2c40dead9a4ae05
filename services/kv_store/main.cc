// kvmesh-kv-store: the cluster KV store (libs/kv_store_server) as a binary of its own;
// `kvmesh kv-store` runs the same server from the kvmesh CLI.
//
// Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables
// set their defaults (KVMESH_CAPACITY_BYTES=8589934592). SIGTERM / SIGINT: report
// NOT_SERVING, finish running calls (up to --shutdown_grace_ms) and exit 0.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "core/command_line.h"
#include "core/flag_checks.h"
#include "core/logging.h"
#include "core/stop_signals.h"
#include "kv_store_server/kv_store_flags.h"
#include "rpc/tls_flags.h"

// The flags kv_store_flags.cc declares; the kvmesh CLI has its own with these names.
ABSL_FLAG(std::string, listen, "0.0.0.0:50070", "Address of the gRPC server (host:port; port 0 picks a free port)");
KVMESH_FLAG_ADDRESS(listen);
ABSL_FLAG(int32_t, metrics_port, 0,
          "HTTP port of /metrics (Prometheus text) and /health, on --listen's host; 0 picks a free one (logged), "
          "-1 disables it");
KVMESH_FLAG_RANGE(metrics_port, -1, 65535);
ABSL_FLAG(std::string, api_keys, "",
          "Comma-separated API keys; when set, every call needs 'authorization: Bearer KEY' metadata");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace kvmesh::kv_store {
namespace {

constexpr char kUsage[] =
    "kvmesh-kv-store: the cluster KV store (kvmesh.v1.KvStore): KV blocks in host memory, keyed by the\n"
    "canonical block identity, that every worker can read and write.\n"
    "\n"
    "Usage: kvmesh-kv-store --block_bytes N (--capacity_bytes N | --capacity_blocks N) [flags]\n"
    "\n"
    "Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables\n"
    "set their defaults (KVMESH_LISTEN=0.0.0.0:50070, KVMESH_CAPACITY_BYTES=8589934592).\n";

int Run(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask
  ParseServiceCommandLine(argc, argv,
                          {.program = "kvmesh-kv-store", .usage = kUsage, .flags_path = "services/kv_store",
                           .extra_flag_files = {kKvStoreFlagsFile, rpc::kTlsFlagsFile}});
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    std::fprintf(stderr, "kvmesh-kv-store: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "kvmesh-kv-store: --log_level must be debug, info, warning or error\n");
    return 2;
  }
  SetLogLevel(level);
  absl::StatusOr<KvStoreServerOptions> options = KvStoreServerOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "kvmesh-kv-store: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  return ServeKvStoreUntilStopped("kvmesh-kv-store", *options);
}

}  // namespace
}  // namespace kvmesh::kv_store

int main(int argc, char** argv) { return kvmesh::kv_store::Run(argc, argv); }
