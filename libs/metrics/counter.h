// Counter: a monotonically increasing total (requests served, tokens generated,
// bytes sent), a thin handle on a prometheus::Counter (prometheus-cpp core).
//
// Hot path: Increment() is prometheus-cpp's lock-free compare-exchange loop on an
// atomic double. No lock, no allocation, no lookup: cache the Counter* that
// CounterFamily::WithLabels() returns and call it directly.
//
// Thread-safety: thread-safe; every method may be called from any thread.
#pragma once

#include <concepts>

#include "prometheus/counter.h"

namespace kvmesh::metrics {

template <typename Metric>
class Family;

class Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds 1.
  void Increment() { impl_.Increment(); }
  // Adds `n`. A counter only goes up: n <= 0 is ignored. Exact up to 2^53.
  template <std::integral Int>
  void Increment(Int n) {
    if (n > 0) impl_.Increment(static_cast<double>(n));
  }
  // Adds `v`. A counter only goes up: v <= 0 and NaN are ignored.
  void Increment(double v) {
    if (v > 0) impl_.Increment(v);
  }

  double Value() const { return impl_.Value(); }

 private:
  friend class Family<Counter>;
  explicit Counter(prometheus::Counter& impl) : impl_(impl) {}

  prometheus::Counter& impl_;  // owned by the prometheus::Family, which the Registry owns
};

}  // namespace kvmesh::metrics
