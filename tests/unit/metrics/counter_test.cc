#include "metrics/counter.h"

#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

// Counter's constructor is private to its family: make one through a registry.
Counter& MakeCounter(Registry& registry) { return *registry.AddCounter("test_total", "Test.").value(); }

TEST(CounterTest, AddsIntegersAndDoubles) {
  Registry registry;
  Counter& counter = MakeCounter(registry);
  EXPECT_EQ(counter.Value(), 0);
  counter.Increment();
  counter.Increment(4);
  counter.Increment(int64_t{10});
  counter.Increment(uint8_t{5});
  EXPECT_EQ(counter.Value(), 20);
  counter.Increment(0.5);
  counter.Increment(0.25f);
  EXPECT_EQ(counter.Value(), 20.75);
}

TEST(CounterTest, IgnoresNegativeZeroAndNaNIncrements) {
  Registry registry;
  Counter& counter = MakeCounter(registry);
  counter.Increment(3);
  counter.Increment(-1);
  counter.Increment(0);
  counter.Increment(-2.5);
  counter.Increment(std::nan(""));
  EXPECT_EQ(counter.Value(), 3);
}

TEST(CounterTest, ConcurrentIncrementsAreExact) {
  constexpr int kThreads = 8;
  constexpr int kIncrements = 200000;
  Registry registry;
  Counter& counter = MakeCounter(registry);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&counter] {
      for (int i = 0; i < kIncrements; ++i) {
        counter.Increment();
        counter.Increment(0.5);  // Sums of halves are exact in a double.
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter.Value(), 1.5 * kThreads * kIncrements);
}

}  // namespace
}  // namespace kvmesh::metrics
