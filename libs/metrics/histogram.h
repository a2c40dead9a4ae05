// Histogram: counts observations (latencies, sizes) in buckets with fixed upper
// bounds chosen when its family is created (see buckets.h), plus their sum. An
// observation v lands in the first bucket whose bound b satisfies v <= b, or in the
// implicit +Inf bucket. Exposition writes the buckets cumulatively.
//
// Hot path: Observe() is a search of the bounds (linear for few buckets, binary
// otherwise) plus two lock-free atomic updates (a bucket fetch_add and a
// compare-exchange loop on the sum). No lock, no allocation, no lookup: cache the
// Histogram* that HistogramFamily::WithLabels() returns.
//
// Thread-safety: thread-safe. A Snapshot() taken while Observe() runs elsewhere may
// hold an observation's bucket without its sum or the reverse; its count is always
// the sum of its buckets (the count is derived, not stored), so _count equals the
// +Inf bucket in every scrape.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvmesh::metrics {

template <typename Metric>
class Family;

class alignas(64) Histogram {
 public:
  // A consistent-enough copy for exposition and tests.
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
    buckets_[BucketIndex(v)].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
  }

  Snapshot TakeSnapshot() const;
  std::span<const double> bucket_bounds() const { return bounds_; }

 private:
  friend class Family<Histogram>;
  // `bounds` must pass ValidateBucketBounds() without a trailing +Inf (the family checks).
  explicit Histogram(std::vector<double> bounds);

  size_t BucketIndex(double v) const;

  std::atomic<double> sum_{0.0};
  const std::vector<double> bounds_;
  // bounds_.size() + 1 per-bucket (not cumulative) counts; the last is +Inf.
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
};

}  // namespace kvmesh::metrics
