// tools/test --sanitize=thread runs this first: a check that tsan_absl_sync.cc shows TSan
// what absl::Mutex does, including a Condition evaluated inside the library after an
// AwaitWithTimeout timed out (the path that made TSan report DiskKvTier's reaper before
// the wrappers passed the library a Condition of their own). Exit 0 and no report: the
// wrappers work; a TSan report fails the run (halt_on_error).
#include <chrono>
#include <thread>
#include <vector>
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
int main() {
  absl::Mutex mu;
  std::vector<int> reaped;  // guarded by mu
  bool done = false;
  std::thread writer([&] {
    for (int i = 0; i < 300; ++i) {
      {
        absl::MutexLock lock(&mu);
        reaped.push_back(i);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    absl::MutexLock lock(&mu);
    done = true;
  });
  int seen = 0;
  while (true) {
    absl::MutexLock lock(&mu);
    auto ready = [&] { return !reaped.empty() || done; };
    mu.AwaitWithTimeout(absl::Condition(&ready), absl::Microseconds(30));
    seen += static_cast<int>(reaped.size());
    reaped.clear();
    if (done) break;
  }
  writer.join();
  return seen == 300 ? 0 : 1;
}
