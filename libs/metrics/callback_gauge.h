// CallbackGauge: a gauge whose value is read from its owner when the registry is
// scraped, e.g. `[pool] { return pool->num_used_blocks(); }`. Nothing is paid
// between scrapes. A CallbackGauge without a callback writes no sample.
//
// Lifetime: the callback usually borrows an object that dies before the Registry.
// Its owner calls ClearCallback() before it dies; once ClearCallback() returns,
// the old callback is not running and will never run again.
//
// Thread-safety: thread-safe. The callback runs on the scraping thread with this
// gauge's mutex held (and no Registry or family lock): it must be thread-safe with
// respect to its owner, must not call SetCallback/ClearCallback on this gauge, and
// its owner must not call SetCallback/ClearCallback while holding a lock that the
// callback takes (that would deadlock against a concurrent scrape).
#pragma once

#include <functional>
#include <mutex>
#include <optional>

namespace kvmesh::metrics {

class CallbackGauge {
 public:
  CallbackGauge() = default;
  CallbackGauge(const CallbackGauge&) = delete;
  CallbackGauge& operator=(const CallbackGauge&) = delete;

  // Replaces the callback; waits for a running call of the old one to finish.
  void SetCallback(std::function<double()> callback);
  // Removes the callback; waits for a running call of it to finish.
  void ClearCallback();

  // Calls the callback now; nullopt when there is none.
  std::optional<double> Evaluate() const;

 private:
  // NOTE: std::mutex, not absl::Mutex: Debian's Abseil is not TSan-instrumented.
  mutable std::mutex mu_;
  std::function<double()> callback_;  // guarded by mu_
};

}  // namespace kvmesh::metrics
