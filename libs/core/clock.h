// Clock: the time source of state that expires (the scheduler's worker leases and
// heartbeat ages, the kv-store's read leases and put intents), injectable so tests can
// expire things without sleeping.
//
// Thread-safety: Now() is thread-safe on every implementation; ManualClock's setters too.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvmesh {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process-wide wall clock (absl::Now()). Never destroyed.
  static Clock& Real();
};

// A clock that moves only when told to. Starts at the Unix epoch + 1,000,000 s.
class ManualClock final : public Clock {
 public:
  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'000'000);
};

}  // namespace kvmesh
