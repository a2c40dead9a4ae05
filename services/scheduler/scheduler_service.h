// SchedulerService: kvmesh.v1.Scheduler over libs/cluster. Thin callback-API
// reactors: convert the request, call the registry / placement policy, convert back,
// finish with rpc::FinishUnary (the one Status -> gRPC conversion). Every call is
// short and non-blocking (a mutex held for microseconds), so it completes inline on
// gRPC's callback thread.
//
// Thread-safety: thread-safe; the registry and policy must outlive the service.
#pragma once

#include "cluster/placement_policy.h"
#include "cluster/worker_registry.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "scheduler_metrics.h"

namespace kvmesh::scheduler {

class SchedulerService final : public v1::Scheduler::CallbackService {
 public:
  // `metrics` may be null; otherwise it must outlive the service too.
  SchedulerService(cluster::WorkerRegistry& registry, const cluster::PlacementPolicy& policy,
                   SchedulerMetrics* metrics = nullptr);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
                                       v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* Place(grpc::CallbackServerContext* context, const v1::PlaceRequest* request,
                                  v1::PlaceResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context, const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* ReportUnreachable(grpc::CallbackServerContext* context,
                                              const v1::ReportUnreachableRequest* request,
                                              v1::ReportUnreachableResponse* response) override;

 private:
  cluster::WorkerRegistry& registry_;
  const cluster::PlacementPolicy& policy_;
  SchedulerMetrics* const metrics_;
};

}  // namespace kvmesh::scheduler
