#include "kv/host_copy_bound.h"

#include <chrono>
#include <cstdint>
#include <thread>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

TEST(HostCopyBoundTest, CopiesWholeBlocksBetweenBuffersLargerThanTheCache) {
  const HostCopyBound bound = MeasureHostCopyBound(int64_t{1} << 20, /*repeats=*/1);
  EXPECT_GT(bound.bytes_per_second, 0);
  EXPECT_GE(bound.buffer_bytes, int64_t{256} << 20);
  EXPECT_EQ(bound.buffer_bytes % bound.block_bytes, 0);
  EXPECT_EQ(bound.num_threads, 1);
}

TEST(IdleHostCopyBoundTest, MeasuresHowLongTheDestinationIdledAndRestartsTheClock) {
  IdleHostCopyBound idle(int64_t{1} << 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const HostCopyBound first = idle.Measure();
  const double first_idle = idle.idle_seconds();
  EXPECT_GT(first.bytes_per_second, 0);
  EXPECT_GE(first_idle, 0.3);
  EXPECT_EQ(first.num_threads, 1);
  // Written by that pass: the next one finds it idle only since then (the rewrite of
  // the source in between, but not the 300 ms).
  (void)idle.Measure();
  EXPECT_LT(idle.idle_seconds(), first_idle - 0.2);
}

}  // namespace
}  // namespace kvmesh::kv
