#include "scheduler_service.h"

#include <chrono>
#include <utility>

#include "core/logging.h"
#include "core/status_macros.h"
#include "rpc/kv_conversions.h"
#include "rpc/status_conversion.h"
#include "cluster_rpc/cluster_conversions.h"

namespace kvmesh::scheduler {

SchedulerService::SchedulerService(cluster::WorkerRegistry& registry, const cluster::PlacementPolicy& policy,
                                   SchedulerMetrics* metrics)
    : registry_(registry), policy_(policy), metrics_(metrics) {}

grpc::ServerUnaryReactor* SchedulerService::Register(grpc::CallbackServerContext* context,
                                                     const v1::RegisterRequest* request,
                                                     v1::RegisterResponse* response) {
  absl::StatusOr<cluster::WorkerRegistration> registration = cluster_rpc::RegistrationFromProto(*request);
  absl::Status status = registration.status();
  if (status.ok()) status = registry_.Register(*registration);
  if (metrics_) metrics_->CountRegistration(status.code());
  if (!status.ok()) {
    KVMESH_LOG(kWarning) << "register rejected" << LogKv("worker", request->worker_id())
                         << LogKv("error", status.ToString());
    return rpc::FinishUnary(context, status);
  }
  KVMESH_LOG(kInfo) << "worker registered" << LogKv("worker", registration->worker_id)
                    << LogKv("address", registration->address)
                    << LogKv("role", cluster::WorkerRoleName(registration->role))
                    << LogKv("model", registration->model);
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(registry_.heartbeat_interval_ms()));
  response->set_lease_ttl_ms(static_cast<uint32_t>(registry_.worker_ttl_ms()));
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SchedulerService::Heartbeat(grpc::CallbackServerContext* context,
                                                      const v1::HeartbeatRequest* request,
                                                      v1::HeartbeatResponse* response) {
  absl::StatusOr<cluster::HeartbeatReport> report = cluster_rpc::HeartbeatReportFromProto(*request);
  absl::Status status = report.status();
  if (status.ok()) status = registry_.Heartbeat(request->worker_id(), *report);
  if (metrics_) metrics_->CountHeartbeat(status.code());
  if (!status.ok()) {
    KVMESH_LOG(kDebug) << "heartbeat rejected" << LogKv("worker", request->worker_id())
                       << LogKv("error", status.ToString());
    return rpc::FinishUnary(context, status);
  }
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(registry_.heartbeat_interval_ms()));
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SchedulerService::Deregister(grpc::CallbackServerContext* context,
                                                       const v1::DeregisterRequest* request,
                                                       v1::DeregisterResponse* /*response*/) {
  const absl::Status status = registry_.Deregister(request->worker_id());
  if (status.ok()) {
    KVMESH_LOG(kInfo) << "worker deregistered" << LogKv("worker", request->worker_id());
  }
  return rpc::FinishUnary(context, status);
}

grpc::ServerUnaryReactor* SchedulerService::Place(grpc::CallbackServerContext* context,
                                                  const v1::PlaceRequest* request, v1::PlaceResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<cluster::Placement> placement =
      policy_.Place(cluster_rpc::PlacementRequestFromProto(*request), registry_);
  if (metrics_) {
    metrics_->ObservePlace(placement.status().code(), placement.ok() && placement->prefill_locally,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (!placement.ok()) {
    KVMESH_LOG(kWarning) << "place failed" << LogKv("request", request->request_id())
                         << LogKv("model", request->model()) << LogKv("error", placement.status().ToString());
    return rpc::FinishUnary(context, placement.status());
  }
  KVMESH_LOG(kDebug) << "placed" << LogKv("request", request->request_id()) << LogKv("reason", placement->reason);
  cluster_rpc::PlacementToProto(*placement, response);
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SchedulerService::ListWorkers(grpc::CallbackServerContext* context,
                                                        const v1::ListWorkersRequest* request,
                                                        v1::ListWorkersResponse* response) {
  for (const cluster::WorkerSnapshot& snapshot : registry_.List(request->model())) {
    v1::WorkerStatus* status = response->add_workers();
    cluster_rpc::WorkerSnapshotToProto(snapshot, status);
    if (request->max_indexed_blocks_per_worker() <= 0) continue;
    for (const kv::KvEvent& event :
         registry_.IndexedBlocks(snapshot.registration.worker_id, request->max_indexed_blocks_per_worker())) {
      rpc::ToProto(event, status->add_indexed_blocks());
    }
  }
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SchedulerService::ReportUnreachable(grpc::CallbackServerContext* context,
                                                              const v1::ReportUnreachableRequest* request,
                                                              v1::ReportUnreachableResponse* response) {
  absl::StatusOr<std::string> id = registry_.ReportUnreachable(request->worker_id(), request->address());
  if (!id.ok()) return rpc::FinishUnary(context, id.status());
  KVMESH_LOG(kWarning) << "worker reported unreachable; no placements on it for now" << LogKv("worker", *id)
                       << LogKv("reporter", request->reporter()) << LogKv("reason", request->reason());
  response->set_worker_id(*id);
  return rpc::FinishUnary(context, absl::OkStatus());
}

}  // namespace kvmesh::scheduler
