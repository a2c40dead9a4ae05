// Counter: a monotonically increasing total (requests served, tokens generated,
// bytes sent). It holds an exact int64 part, fed by integral increments, and a
// double part, fed by floating-point increments; its value is their sum.
//
// Hot path: Increment() of an integer is one relaxed atomic fetch_add; of a double,
// a lock-free compare-exchange loop. No lock, no allocation, no lookup: cache the
// Counter* that CounterFamily::WithLabels() returns and call it directly.
//
// Thread-safety: thread-safe; every method may be called from any thread.
// Reads are relaxed: a concurrent Value() sees each increment either whole or not at all.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>

namespace kvmesh::metrics {

class alignas(64) Counter {  // NOTE: own cache line: hot counters used by different threads never false-share.
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds 1.
  void Increment() { int_total_.fetch_add(1, std::memory_order_relaxed); }
  // Adds `n`, which must fit int64. A counter only goes up: n <= 0 is ignored.
  template <std::integral Int>
  void Increment(Int n) {
    if (n > 0) int_total_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  // Adds `v`. A counter only goes up: v <= 0 and NaN are ignored.
  void Increment(double v) {
    if (v > 0) double_total_.fetch_add(v, std::memory_order_relaxed);
  }

  // The total: exact while only integers were added (up to 2^53).
  double Value() const {
    return static_cast<double>(int_total_.load(std::memory_order_relaxed)) +
           double_total_.load(std::memory_order_relaxed);
  }
  // The part added by integral increments, exact.
  int64_t IntValue() const { return int_total_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> int_total_{0};
  std::atomic<double> double_total_{0.0};
};

}  // namespace kvmesh::metrics
