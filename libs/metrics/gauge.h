// Gauge: a value that goes up and down (running requests, queue depth, a
// temperature). For a value that some other object already owns and that is
// cheap to read when scraped (KV blocks in use), use CallbackGauge instead.
//
// Hot path: Set() is one relaxed atomic store; Increment()/Decrement() a lock-free
// compare-exchange loop. Cache the Gauge* that GaugeFamily::WithLabels() returns.
//
// Thread-safety: thread-safe; every method may be called from any thread.
#pragma once

#include <atomic>

namespace kvmesh::metrics {

class alignas(64) Gauge {  // NOTE: own cache line, as Counter.
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Decrement(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }

  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace kvmesh::metrics
