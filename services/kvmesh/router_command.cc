// `kvmesh router`: the cluster's front door (services/router, also the kvmesh-router
// binary) as a subcommand of the kvmesh CLI, with the CLI's flags: the same REST and
// gRPC APIs as `kvmesh serve`, but tokens come from the workers, each request placed
// by the scheduler (--scheduler) and streamed from the chosen decode worker.
//
// SIGTERM/SIGINT: gRPC health turns NOT_SERVING, new requests get 503 / UNAVAILABLE,
// running ones may finish for --drain-timeout-ms, then the servers stop (cancelling
// the rest on the workers).
#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "core/logging.h"
#include "core/stop_signals.h"
#include "router/router.h"
#include "router/admission_flags.h"
#include "rpc/tls_flags.h"
#include "core/flag_checks.h"

// Shared with `kvmesh serve` (serve_command.cc, serving_flags.cc), `kvmesh worker`
// (libs/cli/worker_flags.cc) and the engine flags (libs/cli/engine_flags.cc).
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(int, grpc_port);
ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(std::string, api_keys);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(int, max_inflight_requests);
ABSL_DECLARE_FLAG(int, http_threads);
ABSL_DECLARE_FLAG(int64_t, drain_timeout_ms);
ABSL_DECLARE_FLAG(std::string, scheduler);

ABSL_FLAG(int, router_max_num_seqs, 256, "Router: the largest n a request may ask for.");
KVMESH_FLAG_RANGE(router_max_num_seqs, 1, 65536);
ABSL_FLAG(int64_t, router_generate_timeout_ms, 600000, "Router: deadline of one request on its decode worker.");
KVMESH_FLAG_RANGE(router_generate_timeout_ms, 1, 86400000);
ABSL_FLAG(int, router_max_attempts, 3,
          "Router: placements per request; a decode worker that cannot be reached before its first token costs "
          "one, and the request is placed again without it.");
KVMESH_FLAG_RANGE(router_max_attempts, 1, 100);
ABSL_FLAG(int64_t, router_placement_view_refresh_ms, 1000,
          "How often the router refreshes its worker view from the scheduler, to place requests itself while the "
          "scheduler is unreachable; 0: no fallback");
KVMESH_FLAG_RANGE(router_placement_view_refresh_ms, 0, 3'600'000);

namespace kvmesh::cli {

int RunRouter(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask

  ParseSubcommandFlags(argc, argv,
                       "kvmesh router --scheduler HOST:PORT [--model DIR] [--host H --port P --grpc-port G]: the "
                       "cluster's front door (OpenAI-compatible REST and the kvmesh.v1.Inference gRPC API)",
                       // The front-door flags (--host, --port, --grpc-port, ...) are serve's.
                       {"router_command", "serve_command", "serving_flags", router::kAdmissionFlagsFile,
                        rpc::kTlsFlagsFile});
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    std::fprintf(stderr, "kvmesh router: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  router::RouterOptions options;
  options.model_dir = ModelDirFlag();
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  options.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    options.api_keys.emplace_back(key);
  }
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight_requests);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.max_num_seqs = absl::GetFlag(FLAGS_router_max_num_seqs);
  options.generate_timeout_ms = absl::GetFlag(FLAGS_router_generate_timeout_ms);
  options.max_attempts = absl::GetFlag(FLAGS_router_max_attempts);
  options.placement_view_refresh_ms = absl::GetFlag(FLAGS_router_placement_view_refresh_ms);
  options.admission = router::AdmissionOptionsFromFlags(options.max_inflight_requests);
  if (options.scheduler_address.empty()) {
    std::fprintf(stderr, "kvmesh router: --scheduler is required\n");
    return 1;
  }
  auto started = router::Router::Start(options);
  if (!started.ok()) {
    std::fprintf(stderr, "kvmesh router: %s\n", std::string(started.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<router::Router> router = std::move(started).value();

  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal) << LogKv("inflight", router->num_inflight());
  if (!router->Drain(absl::GetFlag(FLAGS_drain_timeout_ms))) {
    KVMESH_LOG(kWarning) << "drain deadline passed; cancelling" << LogKv("inflight", router->num_inflight());
  }
  router.reset();
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace kvmesh::cli
