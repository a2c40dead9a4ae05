#include "metrics/callback_gauge.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

namespace kvmesh::metrics {
namespace {

TEST(CallbackGaugeTest, EvaluatesTheCallbackEachTime) {
  CallbackGauge gauge;
  EXPECT_EQ(gauge.Evaluate(), std::nullopt);
  int used_blocks = 3;
  gauge.SetCallback([&used_blocks] { return static_cast<double>(used_blocks); });
  EXPECT_EQ(gauge.Evaluate(), 3.0);
  used_blocks = 7;
  EXPECT_EQ(gauge.Evaluate(), 7.0);
  gauge.ClearCallback();
  EXPECT_EQ(gauge.Evaluate(), std::nullopt);
}

TEST(CallbackGaugeTest, ClearCallbackWaitsForARunningCallback) {
  CallbackGauge gauge;
  std::atomic<bool> entered{false};
  std::atomic<bool> release{false};
  std::atomic<bool> finished{false};
  gauge.SetCallback([&] {
    entered = true;
    while (!release) std::this_thread::yield();
    finished = true;
    return 1.0;
  });
  std::thread scraper([&] { EXPECT_EQ(gauge.Evaluate(), 1.0); });
  while (!entered) std::this_thread::yield();
  std::atomic<bool> cleared{false};
  std::thread clearer([&] {
    gauge.ClearCallback();
    cleared = true;
    // The callback's owner may be destroyed from here on.
    EXPECT_TRUE(finished);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(cleared);  // Still blocked behind the running callback.
  release = true;
  clearer.join();
  scraper.join();
  EXPECT_EQ(gauge.Evaluate(), std::nullopt);
}

}  // namespace
}  // namespace kvmesh::metrics
