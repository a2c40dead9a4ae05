// Histogram: counts observations (latencies, sizes) in buckets with fixed upper
// bounds chosen when its family is created (see buckets.h), plus their sum; a thin
// handle on a prometheus::Histogram (prometheus-cpp core). An observation v lands
// in the first bucket whose bound b satisfies v <= b, or in the implicit +Inf
// bucket. Exposition writes the buckets cumulatively.
//
// Hot path: Observe() is prometheus-cpp's: a linear search of the bounds and two
// updates under the histogram's own mutex (uncontended unless two threads observe
// the same child at once). No allocation, no lookup: cache the Histogram* that
// HistogramFamily::WithLabels() returns.
//
// Thread-safety: thread-safe. A Snapshot is consistent (prometheus-cpp collects
// under the same mutex): its count is the +Inf bucket.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "prometheus/histogram.h"

namespace kvmesh::metrics {

template <typename Metric>
class Family;

class Histogram {
 public:
  // A copy for tests and tools.
  struct Snapshot {
    std::vector<double> bucket_bounds;        // as given at creation, without +Inf
    std::vector<uint64_t> cumulative_counts;  // bucket_bounds.size() + 1 entries; the last is +Inf
    double sum = 0;
    uint64_t count = 0;  // == cumulative_counts.back()
  };

  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records `v`. NaN is ignored (it would poison the sum for good).
  void Observe(double v) {
    if (std::isnan(v)) return;
    impl_.Observe(v);
  }

  Snapshot TakeSnapshot() const;
  std::span<const double> bucket_bounds() const { return bounds_; }

 private:
  friend class Family<Histogram>;
  Histogram(prometheus::Histogram& impl, const std::vector<double>& bounds) : impl_(impl), bounds_(bounds) {}

  prometheus::Histogram& impl_;        // owned by the prometheus::Family, which the Registry owns
  const std::vector<double>& bounds_;  // the family's
};

}  // namespace kvmesh::metrics
