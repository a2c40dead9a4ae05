// WorkerHealth: what a worker's probes report (GET /health and /live on its metrics port),
// so that a Kubernetes startupProbe passes only once the model is loaded and the worker
// has registered with the scheduler, and a readinessProbe fails while it drains.
//
//   /health  503 {"status":"registering"} until the first registration (immediately
//            "ok" when the worker runs without a scheduler), 200 {"status":"ok"} while
//            serving, 503 {"status":"draining"} from SIGTERM on.
//   /live    200 while the process answers at all (a livenessProbe must not fail
//            during a drain, or the kubelet kills a worker finishing its requests).
// The metrics port itself opens only after the model has loaded, so before that both
// probes fail with "connection refused", which the kubelet counts as a failure too.
//
// Thread-safety: thread-safe (atomics); set from the main and heartbeat threads, read
// from the HTTP server's threads.
#pragma once

#include <atomic>
#include <string>

namespace kvmesh::worker {

struct ProbeAnswer {
  int status_code = 200;
  std::string body;
};

class WorkerHealth {
 public:
  // `needs_registration`: the worker has a --scheduler and is not ready until it registered.
  explicit WorkerHealth(bool needs_registration) : registered_(!needs_registration) {}

  void SetRegistered() { registered_.store(true); }
  void SetDraining() { draining_.store(true); }

  ProbeAnswer Health() const;
  ProbeAnswer Live() const { return {200, R"({"status":"alive"})"}; }

 private:
  std::atomic<bool> registered_;
  std::atomic<bool> draining_{false};
};

}  // namespace kvmesh::worker
