#include "metrics/histogram.h"

#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "metrics/buckets.h"
#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

using ::testing::ElementsAre;

// Histogram's constructor is private to its family: make one through a registry.
Histogram* MakeHistogram(Registry& registry, std::vector<double> bounds) {
  return registry.AddHistogram("test_seconds", "Test.", std::move(bounds)).value();
}

TEST(HistogramTest, ObservationsLandInTheFirstBucketWithBoundAtLeastTheValue) {
  Registry registry;
  Histogram* histogram = MakeHistogram(registry, {1, 2, 4});
  for (double v : {-5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 100.0}) histogram->Observe(v);
  const Histogram::Snapshot snapshot = histogram->TakeSnapshot();
  EXPECT_THAT(snapshot.bucket_bounds, ElementsAre(1, 2, 4));
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(3, 5, 7, 9));  // le=1, 2, 4, +Inf
  EXPECT_EQ(snapshot.count, 9u);
  EXPECT_EQ(snapshot.sum, 111.5);
}

TEST(HistogramTest, IgnoresNaNAndCountsInfinityInTheLastBucket) {
  Registry registry;
  Histogram* histogram = MakeHistogram(registry, {1});
  histogram->Observe(std::nan(""));
  histogram->Observe(INFINITY);
  histogram->Observe(-INFINITY);
  const Histogram::Snapshot snapshot = histogram->TakeSnapshot();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(1, 2));
  EXPECT_TRUE(std::isnan(snapshot.sum));  // +Inf + -Inf, as Prometheus would have it.
}

TEST(HistogramTest, BinarySearchAgreesWithLinearScanForManyBuckets) {
  Registry registry;
  const std::vector<double> bounds = LinearBuckets(0, 1, 100).value();  // > 16 bounds: binary search.
  Histogram* histogram = MakeHistogram(registry, bounds);
  for (int i = -1; i <= 100; ++i) {
    histogram->Observe(i);        // On a bound.
    histogram->Observe(i + 0.5);  // Between bounds.
  }
  const Histogram::Snapshot snapshot = histogram->TakeSnapshot();
  // le=k holds i <= k: values -1, -0.5, 0, 0.5, ..., k (2k + 3 of them); +Inf holds all 204.
  for (int k = 0; k < 100; ++k) EXPECT_EQ(snapshot.cumulative_counts[k], uint64_t(2 * k + 3)) << k;
  EXPECT_EQ(snapshot.cumulative_counts[100], 204u);
}

TEST(HistogramTest, ConcurrentObservationsAreExact) {
  constexpr int kThreads = 8;
  constexpr int kObservations = 100000;
  Registry registry;
  Histogram* histogram = MakeHistogram(registry, {0.25, 0.5, 1});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([histogram] {
      for (int i = 0; i < kObservations; ++i) histogram->Observe((i % 4) * 0.5);  // 0, 0.5, 1, 1.5
    });
  }
  for (std::thread& thread : threads) thread.join();
  const uint64_t quarter = uint64_t{kThreads} * kObservations / 4;
  const Histogram::Snapshot snapshot = histogram->TakeSnapshot();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(quarter, 2 * quarter, 3 * quarter, 4 * quarter));
  EXPECT_EQ(snapshot.sum, quarter * 3.0);
}

}  // namespace
}  // namespace kvmesh::metrics
