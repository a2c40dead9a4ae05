// BusyBandwidth on a fake clock: overlapping transfers count their time once, idle
// gaps are not busy time, late and out-of-order completions are folded exactly, and
// decay follows a change of speed.
#include "kv/busy_bandwidth.h"

#include <chrono>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A fake steady clock: time moves only when the test says so.
struct FakeClock {
  BusyBandwidth::TimePoint now{};
  BusyBandwidth::TimePoint At(std::chrono::nanoseconds since_start) const { return BusyBandwidth::TimePoint{} + since_start; }
};

constexpr int64_t kMb = 1'000'000;

TEST(BusyBandwidthTest, ReadsZeroUntilATransferCompleted) {
  FakeClock clock;
  BusyBandwidth rate;
  EXPECT_EQ(rate.units_per_second(), 0);
  rate.Begin(clock.At(seconds(0)));
  EXPECT_EQ(rate.units_per_second(), 0) << "a transfer in flight has measured nothing yet";
  EXPECT_EQ(rate.in_flight(), 1);
  rate.End(clock.At(seconds(0)), clock.At(seconds(2)), 4 * kMb);
  EXPECT_EQ(rate.in_flight(), 0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 2.0 * kMb);
}

TEST(BusyBandwidthTest, OverlappingTransfersCountTheirTimeOnce) {
  FakeClock clock;
  BusyBandwidth rate;
  // Eight 1 MB reads in flight together for 1 ms: the device moved 8 MB in 1 ms, not
  // 1 MB per ms as one read's latency would say.
  for (int i = 0; i < 8; ++i) rate.Begin(clock.At(seconds(0)));
  for (int i = 0; i < 8; ++i) rate.End(clock.At(seconds(0)), clock.At(milliseconds(1)), kMb);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 8e9);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 1e-3);
}

TEST(BusyBandwidthTest, PartlyOverlappingTransfersCountTheirUnion) {
  FakeClock clock;
  BusyBandwidth rate;
  rate.Begin(clock.At(seconds(0)));
  rate.Begin(clock.At(seconds(1)));
  rate.End(clock.At(seconds(0)), clock.At(seconds(2)), 2 * kMb);
  rate.End(clock.At(seconds(1)), clock.At(seconds(3)), 2 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 3.0);  // [0, 3], not 2 + 2
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 4.0 * kMb / 3.0);
}

TEST(BusyBandwidthTest, IdleGapsAreNotBusyTime) {
  FakeClock clock;
  BusyBandwidth rate;
  rate.Begin(clock.At(seconds(0)));
  rate.End(clock.At(seconds(0)), clock.At(seconds(1)), kMb);
  // Ten idle seconds (a burst of loads, then none): the device was not slow meanwhile.
  rate.Begin(clock.At(seconds(11)));
  rate.End(clock.At(seconds(11)), clock.At(seconds(12)), kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 1.0 * kMb);
}

TEST(BusyBandwidthTest, LateOutOfOrderCompletionsAreFoldedExactly) {
  FakeClock clock;
  BusyBandwidth rate;
  // A long read starts at 0, a short one at 1 s and ends at 2 s; the long one's end
  // (3 s) is reported afterwards, as a reaper thread's stamp reaped a step later.
  rate.Begin(clock.At(seconds(0)));
  rate.Begin(clock.At(seconds(1)));
  rate.End(clock.At(seconds(1)), clock.At(seconds(2)), kMb);
  EXPECT_EQ(rate.in_flight(), 1);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 1.0 * kMb) << "what completed so far: 1 MB in [1, 2]";
  rate.End(clock.At(seconds(0)), clock.At(seconds(3)), 5 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 2.0 * kMb);
  // A gap after that still does not count, and a read that starts later folds on its own.
  rate.Begin(clock.At(seconds(10)));
  rate.End(clock.At(seconds(10)), clock.At(seconds(13)), 6 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 6.0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 2.0 * kMb);
  EXPECT_EQ(rate.total_units(), 12 * kMb);
}

TEST(BusyBandwidthTest, FailedTransfersSpendTimeButMoveNothing) {
  FakeClock clock;
  BusyBandwidth rate;
  rate.Begin(clock.At(seconds(0)));
  rate.End(clock.At(seconds(0)), clock.At(seconds(1)), 2 * kMb);
  rate.Begin(clock.At(seconds(1)));
  rate.End(clock.At(seconds(1)), clock.At(seconds(2)), 0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 1.0 * kMb);
}

TEST(BusyBandwidthTest, AForgottenTransferCountsNoTimeButWhatOthersOverlapped) {
  FakeClock clock;
  BusyBandwidth rate;
  rate.Begin(clock.At(seconds(0)));
  rate.End(clock.At(seconds(0)), clock.At(seconds(1)), 1 * kMb);
  // A transfer whose peer hung, forgotten: the estimate and the busy time stay.
  rate.Begin(clock.At(seconds(2)));
  rate.Forget(clock.At(seconds(2)));
  EXPECT_EQ(rate.in_flight(), 0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 1.0 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 1.0);
  // One overlapping a measured transfer leaves that one's time exactly.
  rate.Begin(clock.At(seconds(10)));
  rate.Begin(clock.At(seconds(10)));
  rate.End(clock.At(seconds(10)), clock.At(seconds(11)), 1 * kMb);
  rate.Forget(clock.At(seconds(10)));
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 1.0 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 2.0);
}

TEST(BusyBandwidthTest, SynchronousCopiesAreBusyForTheirOwnDuration) {
  BusyBandwidth rate;
  rate.Add(10 * kMb, 0.5);
  rate.Add(1 * kMb, 0.5);  // a small batch weighs by its bytes, not as one sample of two
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 11.0 * kMb);
  rate.Add(5 * kMb, 0);  // no measured time: ignored, not infinite
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 11.0 * kMb);
}

TEST(BusyBandwidthTest, WithoutDecayItIsCumulative) {
  BusyBandwidth rate;
  for (int i = 0; i < 10; ++i) rate.Add(1000 * kMb, 1.0);
  for (int i = 0; i < 10; ++i) rate.Add(4000 * kMb, 1.0);
  EXPECT_DOUBLE_EQ(rate.units_per_second(), 2500.0 * kMb);
}

TEST(BusyBandwidthTest, DecayFollowsAChangeOfSpeed) {
  BusyBandwidth rate({.half_life_seconds = 1.0});
  for (int i = 0; i < 10; ++i) rate.Add(1000 * kMb, 1.0);
  EXPECT_NEAR(rate.units_per_second(), 1000.0 * kMb, 1e-6 * kMb);
  // The device gets four times faster: ten half-lives later the old speed weighs ~0.1%.
  for (int i = 0; i < 10; ++i) rate.Add(4000 * kMb, 1.0);
  EXPECT_GT(rate.units_per_second(), 3990.0 * kMb);
  EXPECT_LE(rate.units_per_second(), 4000.0 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 20.0) << "the totals do not decay";
}

TEST(BusyBandwidthTest, DecayAppliesToOverlappingTransfersToo) {
  FakeClock clock;
  BusyBandwidth rate({.half_life_seconds = 1.0});
  for (int s = 0; s < 10; ++s) {  // 1 MB/s for 10 s, two reads at a time
    rate.Begin(clock.At(seconds(s)));
    rate.Begin(clock.At(seconds(s)));
    rate.End(clock.At(seconds(s)), clock.At(seconds(s + 1)), kMb / 2);
    rate.End(clock.At(seconds(s)), clock.At(seconds(s + 1)), kMb / 2);
  }
  EXPECT_NEAR(rate.units_per_second(), 1.0 * kMb, 1e-6 * kMb);
  for (int s = 10; s < 20; ++s) {  // then 8 MB/s
    rate.Begin(clock.At(seconds(s)));
    rate.End(clock.At(seconds(s)), clock.At(seconds(s + 1)), 8 * kMb);
  }
  EXPECT_GT(rate.units_per_second(), 7.9 * kMb);
  EXPECT_DOUBLE_EQ(rate.total_busy_seconds(), 20.0);
}

}  // namespace
}  // namespace kvmesh::kv
