// `kvmesh kv-store`: the cluster KV store (libs/kv_store_server, also the
// kvmesh-kv-store binary) as a subcommand of the kvmesh CLI. --listen and
// --metrics_port are the ones `kvmesh worker` takes (defaults 127.0.0.1:0 and -1, off),
// --api_keys the one of `kvmesh serve`.
//
// SIGTERM/SIGINT: gRPC health turns NOT_SERVING, running calls may finish for
// --shutdown_grace_ms, then the server stops.
#include <cstdio>
#include <string>

#include "cli/cli_common.h"
#include "commands.h"
#include "core/stop_signals.h"
#include "kv_store_server/kv_store_flags.h"
#include "rpc/tls_flags.h"

namespace kvmesh::cli {

int RunKvStore(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask
  ParseSubcommandFlags(argc, argv,
                       "kvmesh kv-store --block-bytes N (--capacity-bytes N | --capacity-blocks N) [--listen HOST:PORT] "
                       "[--metrics-port P] [--api-keys K1,K2]: the cluster KV store (kvmesh.v1.KvStore)",
                       {"kv_store_command", kv_store::kKvStoreFlagsFile, rpc::kTlsFlagsFile});
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    std::fprintf(stderr, "kvmesh kv-store: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<kv_store::KvStoreServerOptions> options = kv_store::KvStoreServerOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "kvmesh kv-store: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  return kv_store::ServeKvStoreUntilStopped("kvmesh kv-store", *options);
}

}  // namespace kvmesh::cli
