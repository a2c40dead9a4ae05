// kvmesh-scheduler: the control plane. Keeps the worker registry and the global prefix
// index and answers Place() (kvmesh.v1.Scheduler), with gRPC health and reflection,
// and serves /metrics (SchedulerMetrics) over HTTP on --metrics_port.
//
// Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables
// set their defaults (KVMESH_LISTEN=0.0.0.0:50052). SIGTERM / SIGINT: report
// NOT_SERVING, finish running calls (up to --shutdown_grace_ms) and exit 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/placement_policy.h"
#include "cluster/worker_registry.h"
#include "core/command_line.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "core/host_port.h"
#include "http/metrics_endpoint.h"
#include "metrics/registry.h"
#include "rpc/grpc_server.h"
#include "rpc/tls_flags.h"
#include "scheduler_metrics.h"
#include "scheduler_options.h"
#include "scheduler_service.h"
#include "store_residency_poller.h"
#include "core/flag_checks.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50052", "Address of the gRPC server (host:port; port 0 picks a free port)");
KVMESH_FLAG_ADDRESS(listen);
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000, "Heartbeat interval workers are told to use");
KVMESH_FLAG_RANGE(heartbeat_interval_ms, 1, 3600000);
ABSL_FLAG(int64_t, worker_ttl_ms, 5000, "A worker without a heartbeat for this long is dropped");
KVMESH_FLAG_RANGE(worker_ttl_ms, 1, 86400000);
ABSL_FLAG(int64_t, unreachable_ttl_ms, 10000,
          "A worker a peer reported unreachable (ReportUnreachable) gets no placements for this long");
KVMESH_FLAG_RANGE(unreachable_ttl_ms, 1, 86400000);
ABSL_FLAG(int64_t, in_flight_prefix_ttl_ms, 30000,
          "A placed prompt's blocks count as its worker's until the worker reports them, or for this long "
          "(0: off; placement then sees a prefix only once its KV events arrive)");
KVMESH_FLAG_RANGE(in_flight_prefix_ttl_ms, 0, 86400000);
ABSL_FLAG(int32_t, disaggregation_threshold_tokens, 256,
          "Prompts with fewer uncached tokens are prefilled on the decode worker (0: always disaggregate)");
KVMESH_FLAG_RANGE(disaggregation_threshold_tokens, 0, 1 << 24);
ABSL_FLAG(std::string, placement_strategy, "kv-aware",
          "How a worker is chosen: kv-aware (prefix hits by tier, load, KV usage), or the baselines round-robin and "
          "least-loaded (fewest pending requests)");
ABSL_FLAG(double, overlap_weight, 1.0, "Placement score weight of the cached prompt fraction");
KVMESH_FLAG_RANGE(overlap_weight, 0, 1000);
ABSL_FLAG(double, queue_weight, 0.5, "Placement score weight of pending requests / max_num_seqs");
KVMESH_FLAG_RANGE(queue_weight, 0, 1000);
ABSL_FLAG(double, kv_usage_weight, 0.5, "Placement score weight of KV-cache usage");
KVMESH_FLAG_RANGE(kv_usage_weight, 0, 1000);
ABSL_FLAG(double, overload_kv_usage, 0.95, "KV usage at which a worker counts as overloaded");
KVMESH_FLAG_RANGE(overload_kv_usage, 0, 1);
ABSL_FLAG(int64_t, shutdown_grace_ms, 5000, "On SIGTERM, how long running calls may take to finish");
KVMESH_FLAG_RANGE(shutdown_grace_ms, 0, 86400000);
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(int, metrics_port, 0,
          "HTTP port of /metrics (Prometheus text) and /health, on --listen's host; 0 picks a free one (logged), "
          "-1 disables it");
KVMESH_FLAG_RANGE(metrics_port, -1, 65535);
ABSL_FLAG(std::string, kv_store, "",
          "Cluster kv-stores (host:port, comma-separated; the workers' --kv-store list): their events tell placement "
          "which prompt blocks any worker could load from a store instead of recomputing. Empty: off.");
ABSL_FLAG(std::string, kv_store_api_key, "", "API key sent to the kv-stores (their --api_keys); empty: none");
ABSL_FLAG(int64_t, kv_store_poll_ms, 250, "How often the kv-stores' events are read");
KVMESH_FLAG_RANGE(kv_store_poll_ms, 10, 60000);
ABSL_FLAG(int64_t, kv_store_forget_after_ms, 3000,
          "A kv-store that cannot be read for this long is forgotten: placement counts its blocks as misses");
KVMESH_FLAG_RANGE(kv_store_forget_after_ms, 100, 600000);

namespace kvmesh::scheduler {
namespace {

constexpr char kUsage[] =
    "kvmesh-scheduler: the kvmesh control plane (worker registry, global prefix index, placement).\n"
    "\n"
    "Usage: kvmesh-scheduler [flags]\n"
    "\n"
    "Flags may be spelled with dashes or underscores; KVMESH_<FLAG> environment variables\n"
    "set their defaults (KVMESH_LISTEN=0.0.0.0:50052, KVMESH_WORKER_TTL_MS=5000).\n";

int Run(int argc, char** argv) {
  ParseServiceCommandLine(argc, argv,
                          {.program = "kvmesh-scheduler", .usage = kUsage, .flags_path = "services/scheduler",
                           .extra_flag_files = {rpc::kTlsFlagsFile}});
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    std::fprintf(stderr, "kvmesh-scheduler: %s\n", std::string(s.message()).c_str());
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
  options.unreachable_ttl_ms = absl::GetFlag(FLAGS_unreachable_ttl_ms);
  options.in_flight_prefix_ttl_ms = absl::GetFlag(FLAGS_in_flight_prefix_ttl_ms);
  options.shutdown_grace_ms = absl::GetFlag(FLAGS_shutdown_grace_ms);
  options.placement.disaggregation_threshold_tokens = absl::GetFlag(FLAGS_disaggregation_threshold_tokens);
  options.placement.overlap_weight = absl::GetFlag(FLAGS_overlap_weight);
  options.placement.queue_weight = absl::GetFlag(FLAGS_queue_weight);
  options.placement.kv_usage_weight = absl::GetFlag(FLAGS_kv_usage_weight);
  options.placement.overload_kv_usage = absl::GetFlag(FLAGS_overload_kv_usage);
  if (absl::StatusOr<cluster::PlacementStrategy> strategy =
          cluster::ParsePlacementStrategy(absl::GetFlag(FLAGS_placement_strategy));
      strategy.ok()) {
    options.placement.strategy = *strategy;
  } else {
    std::fprintf(stderr, "kvmesh-scheduler: %s\n", std::string(strategy.status().message()).c_str());
    return 2;
  }
  if (options.heartbeat_interval_ms <= 0 || options.worker_ttl_ms <= options.heartbeat_interval_ms) {
    std::fprintf(stderr, "kvmesh-scheduler: need 0 < --heartbeat_interval_ms < --worker_ttl_ms\n");
    return 2;
  }
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    std::fprintf(stderr, "kvmesh-scheduler: --metrics_port must be -1 (off), 0 (any free port) or a port number\n");
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
                                    .clock = nullptr,
                                    .unreachable_ttl_ms = options.unreachable_ttl_ms,
                                    .in_flight_prefix_ttl_ms = options.in_flight_prefix_ttl_ms});
  const cluster::PlacementPolicy policy(options.placement);
  metrics::Registry metrics_registry;
  absl::StatusOr<std::unique_ptr<SchedulerMetrics>> metrics = SchedulerMetrics::Create(metrics_registry, registry);
  if (!metrics.ok()) {
    KVMESH_LOG(kError) << "cannot create metrics" << LogKv("error", metrics.status().ToString());
    return 1;
  }
  std::unique_ptr<http::HttpServer> metrics_server;
  if (options.metrics_port >= 0) {
    absl::StatusOr<HostPort> listen = ParseHostPort(options.listen_address);
    absl::StatusOr<std::unique_ptr<http::HttpServer>> started =
        listen.ok() ? http::StartMetricsEndpoint(listen->host, options.metrics_port, metrics_registry, "scheduler")
                    : listen.status();
    if (!started.ok()) {
      KVMESH_LOG(kError) << "cannot start the metrics server" << LogKv("error", started.status().ToString());
      return 1;
    }
    metrics_server = std::move(started).value();
  }
  std::vector<std::string> kv_stores;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_kv_store), ',', absl::SkipWhitespace())) {
    kv_stores.emplace_back(absl::StripAsciiWhitespace(part));
  }
  absl::StatusOr<std::unique_ptr<StoreResidencyPoller>> store_poller =
      StoreResidencyPoller::Create({.addresses = std::move(kv_stores),
                                    .api_key = absl::GetFlag(FLAGS_kv_store_api_key),
                                    .poll_interval_ms = absl::GetFlag(FLAGS_kv_store_poll_ms),
                                    .forget_after_ms = absl::GetFlag(FLAGS_kv_store_forget_after_ms)},
                                   registry, metrics_registry);
  if (!store_poller.ok()) {
    std::fprintf(stderr, "kvmesh-scheduler: %s\n", std::string(store_poller.status().message()).c_str());
    return 2;
  }
  (*store_poller)->Start();
  SchedulerService service(registry, policy, metrics->get());
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
  (*store_poller)->Stop();
  server->reset();
  if (metrics_server) metrics_server->Shutdown(std::chrono::milliseconds(1000));
  KVMESH_LOG(kInfo) << "scheduler stopped";
  return 0;
}

}  // namespace
}  // namespace kvmesh::scheduler

int main(int argc, char** argv) { return kvmesh::scheduler::Run(argc, argv); }
