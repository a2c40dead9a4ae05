// Timing helper shared by the benchmarks: the median of repeated runs.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace kvmesh::bench {

// Median seconds of fn() over at least `min_runs` runs and about `min_total_seconds`
// of work (at most `max_runs`), after one warm-up run.
inline double MedianSeconds(const std::function<void()>& fn, int min_runs, double min_total_seconds,
                            int max_runs) {
  using Clock = std::chrono::steady_clock;
  fn();
  std::vector<double> times;
  double total = 0.0;
  while (static_cast<int>(times.size()) < min_runs ||
         (total < min_total_seconds && static_cast<int>(times.size()) < max_runs)) {
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace kvmesh::bench
