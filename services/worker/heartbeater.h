// Heartbeater: a worker's membership in the cluster. On its own thread it registers
// with kvmesh-scheduler (retrying until it answers), then heartbeats the engine's load
// and KV events every interval the scheduler asked for (a full snapshot after
// (re)registering or a failed heartbeat, deltas otherwise), registers again when the
// scheduler has forgotten it, reports draining, and deregisters on Stop.
//
// Thread-safety: thread-safe; the heartbeat state is the thread's own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "kv/kv_types.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "worker/worker_health.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

class Heartbeater {
 public:
  // Starts the thread. `state` (and `health`, when given: told of each registration, so
  // the worker's probes pass) must outlive this.
  Heartbeater(WorkerState& state, std::string scheduler, v1::RegisterRequest registration,
              WorkerHealth* health = nullptr);
  ~Heartbeater();  // Stop()

  // Heartbeats say "draining" from now on (the scheduler stops placing here).
  void SetDraining();
  // Stops heartbeating and deregisters. Idempotent.
  void Stop();

 private:
  bool Register();
  void Loop();
  // False when the scheduler forgot us (Register again).
  bool Beat();

  WorkerState& state_;
  WorkerHealth* const health_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  const v1::RegisterRequest registration_;
  uint32_t interval_ms_ = 1000;
  bool snapshot_ = true;  // heartbeat thread only
  absl::flat_hash_map<std::pair<kv::BlockHash, kv::Tier>, kv::KvEvent> stored_;  // heartbeat thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool draining_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvmesh::worker
