// OutgoingCalls: the client calls one worker has open to its peers — a decode worker's
// remote Prefill calls, a prefill worker's KV push streams. Their completions run on gRPC
// threads after the server call that started them may be gone, and use the WorkerState
// and post to the engine; so before either is destroyed, shutdown cancels every open call
// and waits for its last callback (TSan found a completion posting to an AsyncEngine
// being destroyed at teardown).
//
// A call is registered before it starts and ended as the very last thing its final
// callback does; once stopping, no new call may start.
//
// Thread-safety: thread-safe. A cancel function runs without the lock held, on the thread
// of CancelAllAndWait, possibly while the call ends: it must own what it cancels (capture
// a shared_ptr) and must not block on the call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"

namespace kvmesh::worker {

class OutgoingCalls {
 public:
  using CallId = uint64_t;

  OutgoingCalls() = default;
  OutgoingCalls(const OutgoingCalls&) = delete;
  OutgoingCalls& operator=(const OutgoingCalls&) = delete;
  // Waits for the calls still open (CancelAllAndWait).
  ~OutgoingCalls() { CancelAllAndWait(); }

  // Registers a call that `cancel` cancels (gRPC's TryCancel: its completion still comes).
  // nullopt once CancelAllAndWait has begun: the worker is stopping, the call must not
  // start.
  std::optional<CallId> Begin(std::function<void()> cancel);
  // The call's last callback has run. Unknown ids are ignored.
  void End(CallId id);
  // Refuses new calls, cancels every open one and blocks until each has ended.
  void CancelAllAndWait();

  int64_t num_open() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable all_ended_;
  absl::flat_hash_map<CallId, std::function<void()>> open_;  // guarded by mu_
  CallId next_id_ = 1;                                       // guarded by mu_
  bool stopping_ = false;                                    // guarded by mu_
};

}  // namespace kvmesh::worker
