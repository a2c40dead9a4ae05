// kvmesh.v1 scheduler messages <-> libs/cluster values. From-proto conversions return
// InvalidArgument naming the bad field.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "cluster/placement_policy.h"
#include "cluster/worker_info.h"
#include "cluster/worker_registry.h"
#include "kvmesh/v1/scheduler.pb.h"

namespace kvmesh::cluster_rpc {

absl::StatusOr<cluster::KvCacheSpec> KvCacheSpecFromProto(const v1::KvCacheSpec& proto);
absl::Status KvCacheSpecToProto(const cluster::KvCacheSpec& spec, v1::KvCacheSpec* proto);

cluster::WorkerLoad WorkerLoadFromProto(const v1::WorkerLoad& proto);
void WorkerLoadToProto(const cluster::WorkerLoad& load, v1::WorkerLoad* proto);

absl::StatusOr<cluster::WorkerRole> WorkerRoleFromProto(v1::WorkerRole role);
v1::WorkerRole WorkerRoleToProto(cluster::WorkerRole role);

absl::StatusOr<cluster::WorkerRegistration> RegistrationFromProto(const v1::RegisterRequest& proto);
absl::StatusOr<cluster::HeartbeatReport> HeartbeatReportFromProto(const v1::HeartbeatRequest& proto);
cluster::PlacementRequest PlacementRequestFromProto(const v1::PlaceRequest& proto);
void PlacementToProto(const cluster::Placement& placement, v1::PlaceResponse* proto);
void WorkerSnapshotToProto(const cluster::WorkerSnapshot& snapshot, v1::WorkerStatus* proto);

}  // namespace kvmesh::cluster_rpc
