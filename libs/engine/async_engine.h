// AsyncEngine: runs an Engine on its own thread so that services can submit and
// abort requests from any thread (HTTP handlers, gRPC reactors) and receive
// streamed outputs through callbacks.
//
// The engine loop: drain the inbox (new requests, aborts, posted tasks) → Step() while
// work is unfinished → deliver outputs → sleep until the inbox is non-empty. While the
// only unfinished requests are parked (open remote-prefill leases, computed prefills
// waiting for release) the loop sleeps in short timed waits instead of spinning, so
// that their timeouts still fire. Callbacks run
// on the engine thread; they must be quick and must not call back into the
// AsyncEngine synchronously in a way that waits for the loop (Abort is fine: it only
// posts).
//
// Thread-safety: every public method is thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/engine.h"

namespace kvmesh::engine {

class AsyncEngine {
 public:
  // Takes ownership of the engine; `engine`'s runner must outlive this object.
  // Starts the engine thread.
  explicit AsyncEngine(std::unique_ptr<Engine> engine);
  // Aborts whatever is still running (each gets its final "abort" output) and joins.
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Validates `request` against the engine's limits on the calling thread (the same
  // checks AddRequest makes, so the caller can answer 400 at once) and queues it.
  // `request.on_output` receives every output, the last with finished == true.
  // FailedPrecondition once draining has started. A duplicate id is reported by
  // the final output's status (AlreadyExists), since ids are checked on the loop.
  absl::Status Submit(EngineRequest request);

  // How a request is handed to the engine on its thread: AddRequest (Submit's), or
  // ReserveForRemotePrefill / AddPrefillOnlyRequest for disaggregation. Returns the
  // engine's status for it.
  using AdmitFn = std::function<absl::Status(Engine&, EngineRequest)>;
  // As Submit, but the engine thread admits the request with `admit` (which receives it
  // with its on_output already wrapped for tracking). When `admit` fails, on_output gets
  // one final output carrying the error.
  absl::Status SubmitWith(EngineRequest request, AdmitFn admit);

  // Runs `task` on the engine thread between steps, in posting order (after the
  // requests and aborts posted before it). For the disaggregation calls on requests
  // already submitted (ImportKvBlock, CommitRemotePrefill, ExportKvBlock, ...). Tasks
  // must be quick and must not wait for the loop. Posted tasks run even while draining;
  // those still queued at destruction run before the loop exits.
  void Post(std::function<void(Engine&)> task);

  // Ends the request wherever it is; its callback gets a final "abort" output.
  // Unknown or finished ids are ignored (the request may have just finished).
  void Abort(const std::string& request_id);

  // Stops admitting (Submit fails), lets running requests finish for up to
  // `deadline_ms`, then aborts the rest. Returns when nothing is unfinished.
  void Drain(int64_t deadline_ms);

  // A snapshot taken after the latest step.
  EngineStats stats() const;
  const RequestLimits& limits() const { return limits_; }

 private:
  void Loop();
  void AbortAllLive();

  std::unique_ptr<Engine> engine_;  // used only on the engine thread after construction
  const RequestLimits limits_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct PendingRequest {
    EngineRequest request;
    AdmitFn admit;  // null: AddRequest
  };
  std::deque<PendingRequest> new_requests_;  // guarded by mu_
  std::vector<std::function<void(Engine&)>> tasks_;  // guarded by mu_
  std::vector<std::string> aborts_;        // guarded by mu_
  bool draining_ = false;                  // guarded by mu_
  bool stopping_ = false;                  // guarded by mu_
  int64_t num_unfinished_ = 0;             // guarded by mu_: submitted, final output not yet delivered
  EngineStats stats_;                      // guarded by mu_
  std::condition_variable idle_cv_;
  // Ids handed to the engine whose final output has not been delivered. Engine thread only.
  absl::flat_hash_set<std::string> live_;
  std::thread thread_;
};

}  // namespace kvmesh::engine
