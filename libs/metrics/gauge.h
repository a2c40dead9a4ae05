// Gauge: a value that goes up and down (running requests, queue depth), a thin
// handle on a prometheus::Gauge (prometheus-cpp core). For a value that some other
// object already owns and that is cheap to read when scraped (KV blocks in use),
// use CallbackGauge instead.
//
// Hot path: Set() is one atomic store; Increment()/Decrement() a lock-free
// compare-exchange loop. Cache the Gauge* that GaugeFamily::WithLabels() returns.
//
// Thread-safety: thread-safe; every method may be called from any thread.
#pragma once

#include "prometheus/gauge.h"

namespace kvmesh::metrics {

template <typename Metric>
class Family;

class Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { impl_.Set(v); }
  void Increment(double v = 1.0) { impl_.Increment(v); }
  void Decrement(double v = 1.0) { impl_.Decrement(v); }

  double Value() const { return impl_.Value(); }

 private:
  friend class Family<Gauge>;
  explicit Gauge(prometheus::Gauge& impl) : impl_(impl) {}

  prometheus::Gauge& impl_;  // owned by the prometheus::Family, which the Registry owns
};

}  // namespace kvmesh::metrics
