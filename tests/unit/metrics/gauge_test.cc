#include "metrics/gauge.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

// Gauge's constructor is private to its family: make one through a registry.
Gauge& MakeGauge(Registry& registry) { return *registry.AddGauge("test_level", "Test.").value(); }

TEST(GaugeTest, SetIncrementDecrement) {
  Registry registry;
  Gauge& gauge = MakeGauge(registry);
  EXPECT_EQ(gauge.Value(), 0);
  gauge.Set(10);
  gauge.Increment();
  gauge.Increment(2.5);
  gauge.Decrement();
  gauge.Decrement(20);
  EXPECT_EQ(gauge.Value(), -7.5);
}

TEST(GaugeTest, ConcurrentIncrementsAndDecrementsAreExact) {
  constexpr int kThreads = 8;
  constexpr int kOps = 100000;
  Registry registry;
  Gauge& gauge = MakeGauge(registry);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&gauge, t] {
      for (int i = 0; i < kOps; ++i) {
        if (t % 2 == 0) {
          gauge.Increment(2);
        } else {
          gauge.Decrement(0.5);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(gauge.Value(), (kThreads / 2) * kOps * 2.0 - (kThreads / 2) * kOps * 0.5);
}

}  // namespace
}  // namespace kvmesh::metrics
