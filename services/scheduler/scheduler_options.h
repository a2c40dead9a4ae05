// Options of the scheduler service (from flags / KVMESH_<FLAG> in main.cc).
#pragma once

#include <cstdint>
#include <string>

#include "cluster/placement_policy.h"

namespace kvmesh::scheduler {

struct SchedulerOptions {
  std::string listen_address = "0.0.0.0:50052";
  int64_t heartbeat_interval_ms = 1'000;
  int64_t worker_ttl_ms = 5'000;
  int64_t unreachable_ttl_ms = 10'000;  // WorkerRegistryOptions::unreachable_ttl_ms
  int64_t in_flight_prefix_ttl_ms = 30'000;  // WorkerRegistryOptions::in_flight_prefix_ttl_ms
  int64_t shutdown_grace_ms = 5'000;
  int32_t metrics_port = 0;  // HTTP /metrics; 0: an ephemeral port, -1: off
  cluster::PlacementOptions placement;
};

}  // namespace kvmesh::scheduler
