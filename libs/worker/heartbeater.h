// Heartbeater: a worker's membership in the cluster. On its own thread it registers
// with kvmesh-scheduler (retrying until it answers), then heartbeats the engine's load
// and KV events every interval the scheduler asked for (a full snapshot after
// (re)registering or a failed heartbeat, deltas otherwise), registers again when the
// scheduler has forgotten it, reports draining, and deregisters on Stop.
//
// KV events are never lost and never pile up: every interval, registered or not, the
// engine's pending events are folded into `stored_`, the worker's view of its own cached
// blocks (one entry per (block hash, tier), so it is bounded by the pool's capacity,
// not by how long the scheduler has been away). A heartbeat that fails sends the
// snapshot next time; an engine that does not answer within the timeout keeps its
// answer pending and the next interval takes it (before, that answer and its drained
// events were dropped). A worker without a scheduler records no events at all
// (Worker::Init, worker.cc).
//
// Thread-safety: thread-safe; the heartbeat state is the thread's own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/engine.h"
#include "kv/kv_types.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "worker/worker_health.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

class Heartbeater {
 public:
  // Starts the thread. `state` (and `health`, when given: told of each registration, so
  // the worker's probes pass) must outlive this. `engine_timeout_ms`: how long one
  // interval waits for the engine's answer (its stats and events) before skipping.
  Heartbeater(WorkerState& state, std::string scheduler, v1::RegisterRequest registration,
              WorkerHealth* health = nullptr, int64_t engine_timeout_ms = 5000);
  ~Heartbeater();  // Stop()

  // Heartbeats say "draining" from now on (the scheduler stops placing here).
  void SetDraining();
  // Stops heartbeating and deregisters. Idempotent.
  void Stop();

 private:
  bool Register();
  void Loop();
  // Takes the engine's stats and pending KV events and folds the events into `stored_`;
  // false (nothing taken yet) when the engine has not answered within the timeout, its
  // answer then stays pending for the next call.
  bool CollectEngineState();
  // False when the scheduler forgot us (Register again).
  bool Beat();

  using EngineState = std::pair<engine::EngineStats, std::vector<kv::KvEvent>>;

  WorkerState& state_;
  WorkerHealth* const health_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  const v1::RegisterRequest registration_;
  const int64_t engine_timeout_ms_;
  uint32_t interval_ms_ = 1000;
  bool snapshot_ = true;  // heartbeat thread only
  absl::flat_hash_map<std::pair<kv::BlockHash, kv::Tier>, kv::KvEvent> stored_;  // heartbeat thread only
  std::future<EngineState> pending_;   // heartbeat thread only: an engine answer not yet taken
  engine::EngineStats stats_;          // heartbeat thread only: the last taken
  std::vector<kv::KvEvent> unsent_;    // heartbeat thread only: taken, not yet acknowledged
  std::mutex mu_;
  std::condition_variable cv_;
  bool draining_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvmesh::worker
