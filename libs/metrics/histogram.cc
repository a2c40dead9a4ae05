#include "metrics/histogram.h"

#include <algorithm>
#include <utility>

namespace kvmesh::metrics {
namespace {
// Below this many bounds a forward scan beats binary search: its branches are
// predictable when observations cluster, as latencies do.
constexpr size_t kLinearSearchMaxBounds = 16;
}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

size_t Histogram::BucketIndex(double v) const {
  const size_t n = bounds_.size();
  if (n <= kLinearSearchMaxBounds) {
    size_t i = 0;
    while (i < n && v > bounds_[i]) ++i;
    return i;
  }
  return static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
}

Histogram::Snapshot Histogram::TakeSnapshot() const {
  Snapshot snapshot;
  snapshot.bucket_bounds = bounds_;
  snapshot.cumulative_counts.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = running;
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace kvmesh::metrics
