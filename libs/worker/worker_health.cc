#include "worker/worker_health.h"

namespace kvmesh::worker {

ProbeAnswer WorkerHealth::Health() const {
  // Draining wins: a worker that never registered and is asked to stop is not ready either.
  if (draining_.load()) return {503, R"({"status":"draining"})"};
  if (!registered_.load()) return {503, R"({"status":"registering"})"};
  return {200, R"({"status":"ok"})"};
}

}  // namespace kvmesh::worker
