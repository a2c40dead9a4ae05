// kvmesh-router: the cluster's front door (services/router) as a binary of its own,
// for deployments that run the router apart (one Deployment per service); `kvmesh
// router` runs the same library from the kvmesh CLI.
//
// SIGTERM / SIGINT: gRPC health NOT_SERVING, new requests get 503 / UNAVAILABLE,
// running ones may finish for --drain_timeout_ms, then the servers stop and exit 0.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "router/admission_flags.h"
#include "core/command_line.h"
#include "core/logging.h"
#include "router/router.h"
#include "rpc/tls_flags.h"
#include "core/flag_checks.h"

ABSL_FLAG(std::string, scheduler, "", "host:port of kvmesh-scheduler (required)");
KVMESH_FLAG_ADDRESS(scheduler);
ABSL_FLAG(std::string, model, KVMESH_DEFAULT_MODEL_DIR,
          "Model directory: config.json and the tokenizer (no weights are loaded)");
ABSL_FLAG(std::string, served_model_name, "", "Model name clients use and workers register (default: --model's name)");
ABSL_FLAG(std::string, chat_template, "", "A Jinja chat template file used instead of the model's own.");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address both servers listen on");
ABSL_FLAG(int, port, 8000, "REST port (OpenAI-compatible API, /health, /metrics); 0 picks a free one");
KVMESH_FLAG_RANGE(port, 0, 65535);
ABSL_FLAG(int, grpc_port, 50051, "gRPC port (kvmesh.v1.Inference + health + reflection); 0: a free one, -1: off");
KVMESH_FLAG_RANGE(grpc_port, -1, 65535);
ABSL_FLAG(std::string, api_keys, "", "Comma-separated API keys; when set, requests need 'Authorization: Bearer KEY'");
ABSL_FLAG(int, max_model_len, 0, "Longest prompt + completion in tokens (0: the model's)");
KVMESH_FLAG_RANGE(max_model_len, 0, 1 << 24);
ABSL_FLAG(int, max_inflight_requests, 256,
          "Requests in flight per front door before 429 / RESOURCE_EXHAUSTED (a bound on the router itself; "
          "workers queue beyond their batch size)");
KVMESH_FLAG_RANGE(max_inflight_requests, 1, 1000000);
ABSL_FLAG(int, max_num_seqs, 256, "The largest n a request may ask for");
KVMESH_FLAG_RANGE(max_num_seqs, 1, 65536);
ABSL_FLAG(int, max_attempts, 3, "Placements per request (an unreachable decode worker costs one)");
KVMESH_FLAG_RANGE(max_attempts, 1, 100);
ABSL_FLAG(int64_t, placement_view_refresh_ms, 1000,
          "How often the router refreshes its worker view from the scheduler, to place requests itself while the "
          "scheduler is unreachable; 0: no fallback");
KVMESH_FLAG_RANGE(placement_view_refresh_ms, 0, 3'600'000);
ABSL_FLAG(int64_t, generate_timeout_ms, 600000, "Deadline of one request on its decode worker");
KVMESH_FLAG_RANGE(generate_timeout_ms, 1, 86400000);
ABSL_FLAG(int, http_threads, 2, "HTTP I/O threads");
KVMESH_FLAG_RANGE(http_threads, 1, 1024);
ABSL_FLAG(int64_t, drain_timeout_ms, 30000, "On SIGTERM: how long running requests may take to finish");
KVMESH_FLAG_RANGE(drain_timeout_ms, 0, 86400000);
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace kvmesh::router {
namespace {

constexpr char kUsage[] =
    "kvmesh-router: the kvmesh cluster's front door (OpenAI-compatible REST and gRPC kvmesh.v1.Inference);\n"
    "each request is placed by kvmesh-scheduler and streamed from a decode worker.\n"
    "\n"
    "Usage: kvmesh-router --scheduler HOST:PORT [flags]\n"
    "\n"
    "Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables\n"
    "set their defaults (KVMESH_SCHEDULER=scheduler:50052).\n";

int Run(int argc, char** argv) {
  ParseServiceCommandLine(argc, argv,
                          {.program = "kvmesh-router", .usage = kUsage, .flags_path = "services/router",
                           .extra_flag_files = {rpc::kTlsFlagsFile}});
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    std::fprintf(stderr, "kvmesh-router: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "kvmesh-router: --log_level must be debug, info, warning or error\n");
    return 2;
  }
  SetLogLevel(level);
  RouterOptions options;
  options.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  if (options.scheduler_address.empty()) {
    std::fprintf(stderr, "kvmesh-router: --scheduler is required\n");
    return 2;
  }
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  options.chat_template = absl::GetFlag(FLAGS_chat_template);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    options.api_keys.emplace_back(key);
  }
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight_requests);
  options.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.placement_view_refresh_ms = absl::GetFlag(FLAGS_placement_view_refresh_ms);
  options.generate_timeout_ms = absl::GetFlag(FLAGS_generate_timeout_ms);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.admission = AdmissionOptionsFromFlags(options.max_inflight_requests);

  // Block the stop signals in every thread (the servers' inherit this mask); this
  // thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto router = Router::Start(options);
  if (!router.ok()) {
    std::fprintf(stderr, "kvmesh-router: %s\n", std::string(router.status().message()).c_str());
    return 1;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", strsignal(signal_number))
                    << LogKv("inflight", (*router)->num_inflight());
  if (!(*router)->Drain(absl::GetFlag(FLAGS_drain_timeout_ms))) {
    KVMESH_LOG(kWarning) << "drain deadline passed; cancelling" << LogKv("inflight", (*router)->num_inflight());
  }
  router->reset();
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace
}  // namespace kvmesh::router

int main(int argc, char** argv) { return kvmesh::router::Run(argc, argv); }
