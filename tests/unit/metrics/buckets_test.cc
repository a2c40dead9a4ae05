#include "metrics/buckets.h"

#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvmesh::metrics {
namespace {

using ::testing::ElementsAre;

TEST(BucketsTest, ExponentialBucketsMultiplyByFactor) {
  EXPECT_THAT(ExponentialBuckets(1, 2, 5).value(), ElementsAre(1, 2, 4, 8, 16));
  EXPECT_THAT(ExponentialBuckets(0.5, 10, 1).value(), ElementsAre(0.5));
}

TEST(BucketsTest, ExponentialBucketsRejectBadArguments) {
  EXPECT_EQ(ExponentialBuckets(0, 2, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExponentialBuckets(1, 1, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExponentialBuckets(1, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExponentialBuckets(1, 1e300, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BucketsTest, LinearBucketsAddWidth) {
  EXPECT_THAT(LinearBuckets(-1, 0.5, 4).value(), ElementsAre(-1, -0.5, 0, 0.5));
  EXPECT_EQ(LinearBuckets(1, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBuckets(1, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBuckets(1e20, 1, 3).status().code(), absl::StatusCode::kInvalidArgument);  // Bounds collapse.
}

TEST(BucketsTest, ValidateBucketBoundsWantsFiniteStrictlyIncreasing) {
  EXPECT_TRUE(ValidateBucketBounds({}).ok());
  EXPECT_TRUE(ValidateBucketBounds({0.1, 1, 10}).ok());
  EXPECT_TRUE(ValidateBucketBounds({0.1, 1, INFINITY}).ok());
  EXPECT_EQ(ValidateBucketBounds({1, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBucketBounds({2, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBucketBounds({NAN, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBucketBounds({-INFINITY, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBucketBounds({INFINITY, INFINITY}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BucketsTest, LatencyBucketsAreValidAndSpanTheirRanges) {
  const std::vector<double> ttft = TimeToFirstTokenBuckets();
  EXPECT_TRUE(ValidateBucketBounds(ttft).ok());
  EXPECT_EQ(ttft.front(), 0.001);
  EXPECT_EQ(ttft.back(), 80);
  const std::vector<double> itl = InterTokenLatencyBuckets();
  EXPECT_TRUE(ValidateBucketBounds(itl).ok());
  EXPECT_EQ(itl.front(), 0.001);
  EXPECT_EQ(itl.back(), 10);
  const std::vector<double> e2e = EndToEndLatencyBuckets();
  EXPECT_TRUE(ValidateBucketBounds(e2e).ok());
  EXPECT_EQ(e2e.front(), 0.01);
  EXPECT_EQ(e2e.back(), 1920);
}

}  // namespace
}  // namespace kvmesh::metrics
