// Worker: one worker of the disaggregated cluster (docs/architecture.md §1) assembled
// from its parts — the continuous-batching engine on its own thread (AsyncEngine), the
// kvmesh.v1.Worker service (worker_service.h) as a prefill worker, a decode worker or
// both, the UCX KV data plane over its whole pool, registration and heartbeats with the
// scheduler (heartbeater.h), and /metrics, /health, /live.
//
//   auto worker = Worker::Start(options, std::move(model));  // serving once this returns
//   ... wait for SIGTERM ...
//   worker->Drain();  // report draining, hand queued requests back, finish, stop
//
// Thread-safety: Start, Drain and destruction from one controlling thread; the
// accessors from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/async_engine.h"
#include "http/http_server.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "metrics/registry.h"
#include "rpc/grpc_server.h"
#include "serving/serving_metrics.h"
#include "worker/heartbeater.h"
#include "worker/kv_transfer_metrics.h"
#include "worker/unreachable_reporter.h"
#include "worker/worker_health.h"
#include "worker/worker_options.h"
#include "worker/worker_service.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

class Worker {
 public:
  // Creates the engine over `model`, starts the servers and, with a scheduler, the
  // heartbeats. InvalidArgument for bad options, FailedPrecondition for `kUcx` without
  // UCX, Unavailable when a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options, WorkerModel model);
  // Drain(), if it has not run.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The address peers and the scheduler reach this worker at, and its id.
  const std::string& address() const { return address_; }
  const std::string& worker_id() const { return worker_id_; }
  // -1 without --metrics-port.
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : -1; }

  // The SIGTERM sequence: /health and heartbeats say draining (the scheduler stops
  // placing here), requests still queued go back to the router (ABORTED, placed again),
  // running ones may finish for drain_timeout_ms, then it deregisters and stops serving.
  // Once; later calls return at once.
  void Drain();

 private:
  Worker(const WorkerOptions& options, WorkerModel model) : options_(options), model_(std::move(model)) {}
  absl::Status Init();
  absl::Status StartUcx(const std::vector<kv::KvStorage*>& rank_storages);
  absl::Status StartMetricsServer();
  void StartHeartbeats(const v1::KvCacheSpec& spec);

  const WorkerOptions options_;
  WorkerModel model_;
  std::string address_;
  std::string worker_id_;
  bool drained_ = false;
  // Declared in the order they start; the destructor tears down the rest in reverse.
  // One per tensor-parallel rank, each over that rank's pool (kv/transport/kv_rank_group.h);
  // none: KV moves over gRPC.
  std::vector<std::unique_ptr<kv::UcxKvTransport>> ucx_;
  std::vector<kv::SharedKeySpace> kv_store_key_spaces_;  // registered with the scheduler
  std::vector<WorkerState::KvRankTransport> ucx_ranks_;
  std::unique_ptr<engine::AsyncEngine> engine_;
  std::unique_ptr<WorkerState> state_;
  metrics::Registry registry_;
  std::unique_ptr<serving::ServingMetrics> serving_metrics_;
  std::unique_ptr<KvTransferMetrics> transfer_metrics_;
  std::unique_ptr<WorkerHealth> health_;
  std::unique_ptr<http::HttpServer> metrics_server_;
  std::unique_ptr<UnreachableReporter> reporter_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<rpc::GrpcServer> server_;
  std::unique_ptr<Heartbeater> heartbeater_;
};

}  // namespace kvmesh::worker
