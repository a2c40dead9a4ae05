// FallbackPlacer: the router's last view of the cluster, so that the scheduler is off
// the token path. Every refresh interval it asks the scheduler for the live workers of
// the model (Scheduler.ListWorkers: addresses, roles, load, draining, and up to
// max_indexed_blocks_per_worker of each worker's indexed KV blocks) and rebuilds a
// local cluster::WorkerRegistry from the answer. When a Place() to the scheduler fails
// because the scheduler is unreachable or has no worker to offer (ShouldFallBack), the
// router places the request
// here instead, with the scheduler's own PlacementPolicy over that registry: load-based
// (with provisional load for what it placed since the view was taken) and prefix-aware
// (from the indexed blocks).
//
//   1. A refresh that fails keeps the previous view (stale, not empty): the workers of
//      a scheduler that died are still the best guess, and a dead decode worker costs
//      one retry (RemoteTokenSource excludes it).
//   2. A view is replaced whole; the provisional load restarts from the fresh one.
//      NOTE: except by an answer without any decode-capable worker while the view has
//      some: a scheduler that just restarted has not heard from its workers yet (they
//      re-register within a heartbeat or two). If they really are gone, placing on
//      them fails as unreachable, costs a retry each, and the request ends with that
//      error: clear, as without the fallback.
//   3. Without any view yet (the scheduler was never reached), Place() is Unavailable.
//
// Thread-safety: thread-safe. The refresh runs on the placer's own thread; Place() and
// Update() from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/placement_policy.h"
#include "cluster/worker_registry.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"

namespace kvmesh::router {

struct FallbackPlacerOptions {
  std::string model;                        // as workers register it
  int64_t refresh_interval_ms = 1'000;      // 0: no refresh thread (tests call Update)
  int64_t list_timeout_ms = 2'000;
  int32_t max_indexed_blocks_per_worker = 1 << 16;
  cluster::PlacementOptions placement;      // NOTE: the scheduler's defaults
};

class FallbackPlacer {
 public:
  // `channel` is the scheduler's; null with refresh_interval_ms == 0 only.
  FallbackPlacer(FallbackPlacerOptions options, std::shared_ptr<grpc::Channel> channel);
  ~FallbackPlacer();  // stops the refresh thread
  FallbackPlacer(const FallbackPlacer&) = delete;
  FallbackPlacer& operator=(const FallbackPlacer&) = delete;

  // Whether a failed Scheduler.Place is worth placing from the view: DEADLINE_EXCEEDED
  // (the scheduler hung) or UNAVAILABLE (it is down, or it has no live worker: after a
  // restart, before its workers re-registered). Not for a refusal of the request
  // itself (INVALID_ARGUMENT), which the view would refuse too.
  static bool ShouldFallBack(const grpc::Status& status);

  // Replaces the view with `workers` (a ListWorkers answer). InvalidArgument when a
  // worker's fields are bad (the previous view stays).
  absl::Status Update(const v1::ListWorkersResponse& workers);

  // Places `request` on the last view (cluster::PlacementPolicy::Place). Unavailable
  // without a view or with no decode-capable worker left in it; InvalidArgument as the
  // scheduler's Place.
  absl::StatusOr<v1::PlaceResponse> Place(const v1::PlaceRequest& request);

  // Workers in the view (0 before the first one).
  int32_t num_workers() const;
  // Successful refreshes so far.
  int64_t num_updates() const;

 private:
  void Loop();
  absl::Status Refresh();

  const FallbackPlacerOptions options_;
  const cluster::PlacementPolicy policy_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Replaced whole by Update (the registry is thread-safe itself; mu_ guards the pointer).
  std::shared_ptr<cluster::WorkerRegistry> registry_;  // guarded by mu_
  int64_t num_updates_ = 0;                            // guarded by mu_
  bool view_has_decode_ = false;                       // guarded by mu_
  bool stopping_ = false;                              // guarded by mu_
  bool last_refresh_failed_ = false;                   // refresh thread only
  std::thread thread_;
};

}  // namespace kvmesh::router
