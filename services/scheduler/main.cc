// kvmesh-scheduler: the control plane. Keeps the worker registry and the global prefix
// index and answers Place() (kvmesh.v1.Scheduler), with gRPC health and reflection.
//
// Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables
// set their defaults (KVMESH_LISTEN=0.0.0.0:50052). SIGTERM / SIGINT: report
// NOT_SERVING, finish running calls (up to --shutdown_grace_ms) and exit 0.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/placement_policy.h"
#include "cluster/worker_registry.h"
#include "core/logging.h"
#include "rpc/grpc_server.h"
#include "scheduler_options.h"
#include "scheduler_service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50052", "Address of the gRPC server (host:port; port 0 picks a free port)");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000, "Heartbeat interval workers are told to use");
ABSL_FLAG(int64_t, worker_ttl_ms, 5000, "A worker without a heartbeat for this long is dropped");
ABSL_FLAG(int32_t, disaggregation_threshold_tokens, 256,
          "Prompts with fewer uncached tokens are prefilled on the decode worker (0: always disaggregate)");
ABSL_FLAG(double, overlap_weight, 1.0, "Placement score weight of the cached prompt fraction");
ABSL_FLAG(double, queue_weight, 0.5, "Placement score weight of pending requests / max_num_seqs");
ABSL_FLAG(double, kv_usage_weight, 0.5, "Placement score weight of KV-cache usage");
ABSL_FLAG(double, overload_kv_usage, 0.95, "KV usage at which a worker counts as overloaded");
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000, "On SIGTERM, how long running calls may take to finish");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace kvmesh::scheduler {
namespace {

constexpr char kUsage[] =
    "kvmesh-scheduler: the kvmesh control plane (worker registry, global prefix index, placement).\n"
    "\n"
    "Usage: kvmesh-scheduler [flags]\n"
    "\n"
    "Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables\n"
    "set their defaults (KVMESH_LISTEN=0.0.0.0:50052, KVMESH_WORKER_TTL_MS=5000).\n";

bool IsOurFlag(const absl::CommandLineFlag& flag) { return absl::StrContains(flag.Filename(), "services/scheduler"); }

void PrintHelp() {
  std::cout << kUsage << "\nFlags:\n";
  std::map<std::string, const absl::CommandLineFlag*> sorted;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurFlag(*flag)) sorted.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : sorted) {
    std::cout << "  --" << name << " (" << flag->Help() << ")\n      default: " << flag->DefaultValue()
              << "   env: KVMESH_" << absl::AsciiStrToUpper(name) << "\n";
  }
}

// KVMESH_<NAME> sets the default of our flag <name>; a bad value exits with 2.
void ApplyEnvironmentDefaults() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsOurFlag(*flag)) continue;
    const std::string env = absl::StrCat("KVMESH_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "kvmesh-scheduler: bad value in %s: %s\n", env.c_str(), error.c_str());
      std::exit(2);
    }
  }
}

// `--worker-ttl-ms=5` -> `--worker_ttl_ms=5`.
std::string NormalizeFlagName(const char* arg) {
  std::string s(arg);
  if (s.size() < 3 || s[0] != '-' || s[1] != '-') return s;
  const size_t end = std::min(s.find('='), s.size());
  for (size_t i = 2; i < end; ++i) {
    if (s[i] == '-') s[i] = '_';
  }
  return s;
}

int Run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0 ||
        std::strcmp(argv[i], "--helpfull") == 0) {
      PrintHelp();
      return 0;
    }
  }
  absl::SetProgramUsageMessage(kUsage);
  ApplyEnvironmentDefaults();
  std::vector<std::string> normalized;
  for (int i = 0; i < argc; ++i) normalized.push_back(i == 0 ? std::string(argv[0]) : NormalizeFlagName(argv[i]));
  std::vector<char*> args;
  for (std::string& s : normalized) args.push_back(s.data());
  const std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "kvmesh-scheduler: unexpected argument \"%s\" (see --help)\n", positional[1]);
    return 2;
  }
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "kvmesh-scheduler: --log_level must be debug, info, warning or error\n");
    return 2;
  }
  SetLogLevel(level);

  SchedulerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  options.worker_ttl_ms = absl::GetFlag(FLAGS_worker_ttl_ms);
  options.shutdown_grace_ms = absl::GetFlag(FLAGS_shutdown_grace_ms);
  options.placement.disaggregation_threshold_tokens = absl::GetFlag(FLAGS_disaggregation_threshold_tokens);
  options.placement.overlap_weight = absl::GetFlag(FLAGS_overlap_weight);
  options.placement.queue_weight = absl::GetFlag(FLAGS_queue_weight);
  options.placement.kv_usage_weight = absl::GetFlag(FLAGS_kv_usage_weight);
  options.placement.overload_kv_usage = absl::GetFlag(FLAGS_overload_kv_usage);
  if (options.heartbeat_interval_ms <= 0 || options.worker_ttl_ms <= options.heartbeat_interval_ms) {
    std::fprintf(stderr, "kvmesh-scheduler: need 0 < --heartbeat_interval_ms < --worker_ttl_ms\n");
    return 2;
  }
  if (options.shutdown_grace_ms < 0 || options.placement.disaggregation_threshold_tokens < 0) {
    std::fprintf(stderr, "kvmesh-scheduler: --shutdown_grace_ms and --disaggregation_threshold_tokens must be >= 0\n");
    return 2;
  }

  // Block the shutdown signals in every thread (gRPC's inherit this mask); main waits
  // for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  cluster::WorkerRegistry registry({.heartbeat_interval_ms = options.heartbeat_interval_ms,
                                    .worker_ttl_ms = options.worker_ttl_ms,
                                    .clock = nullptr});
  const cluster::PlacementPolicy policy(options.placement);
  SchedulerService service(registry, policy);
  absl::StatusOr<std::unique_ptr<rpc::GrpcServer>> server = rpc::GrpcServer::Start(
      {.address = options.listen_address}, {{&service, v1::Scheduler::service_full_name()}});
  if (!server.ok()) {
    KVMESH_LOG(kError) << "cannot start" << LogKv("error", server.status().ToString());
    return 1;
  }
  KVMESH_LOG(kInfo) << "scheduler listening" << LogKv("address", (*server)->address())
                    << LogKv("port", (*server)->port()) << LogKv("heartbeat_interval_ms", options.heartbeat_interval_ms)
                    << LogKv("worker_ttl_ms", options.worker_ttl_ms)
                    << LogKv("disaggregation_threshold_tokens", options.placement.disaggregation_threshold_tokens);

  // Expiry is lazy on every call (and logged by the registry); the sweeper makes it
  // prompt in the logs and frees a dead worker's index entries without waiting for traffic.
  absl::Notification stop_sweeper;
  std::thread sweeper([&] {
    const absl::Duration period = absl::Milliseconds(std::max<int64_t>(options.heartbeat_interval_ms, 50));
    while (!stop_sweeper.WaitForNotificationWithTimeout(period)) registry.ExpireStale();
  });

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  KVMESH_LOG(kInfo) << "shutting down" << LogKv("signal", strsignal(signal_number))
                    << LogKv("grace_ms", options.shutdown_grace_ms);
  (*server)->Shutdown(options.shutdown_grace_ms);
  stop_sweeper.Notify();
  sweeper.join();
  server->reset();
  KVMESH_LOG(kInfo) << "scheduler stopped";
  return 0;
}

}  // namespace
}  // namespace kvmesh::scheduler

int main(int argc, char** argv) { return kvmesh::scheduler::Run(argc, argv); }
