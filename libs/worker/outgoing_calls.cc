#include "worker/outgoing_calls.h"

#include <chrono>
#include <utility>
#include <vector>

#include "core/logging.h"

namespace kvmesh::worker {

std::optional<OutgoingCalls::CallId> OutgoingCalls::Begin(std::function<void()> cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return std::nullopt;
  const CallId id = next_id_++;
  open_.emplace(id, std::move(cancel));
  return id;
}

void OutgoingCalls::End(CallId id) {
  std::lock_guard<std::mutex> lock(mu_);
  // NOTE: notified under the lock: the waiter may destroy this object as soon as it
  // sees no call open, so nothing of it may be touched after the unlock.
  if (open_.erase(id) == 1 && open_.empty()) all_ended_.notify_all();
}

void OutgoingCalls::CancelAllAndWait() {
  std::vector<std::function<void()>> cancels;
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  for (auto& [id, cancel] : open_) {
    if (cancel) cancels.push_back(std::exchange(cancel, nullptr));
  }
  if (!cancels.empty()) {
    lock.unlock();
    for (const std::function<void()>& cancel : cancels) cancel();
    cancels.clear();  // their captures may be the calls' last owners: not under the lock
    lock.lock();
  }
  // A cancelled gRPC call completes within milliseconds; say so if one takes longer.
  if (!all_ended_.wait_for(lock, std::chrono::seconds(5), [this] { return open_.empty(); })) {
    KVMESH_LOG(kWarning) << "waiting for outgoing calls to end after cancelling them"
                         << LogKv("open", open_.size());
    all_ended_.wait(lock, [this] { return open_.empty(); });
  }
}

int64_t OutgoingCalls::num_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(open_.size());
}

}  // namespace kvmesh::worker
