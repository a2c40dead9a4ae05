#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(DTypeTest, Bf16RoundTripsEveryBf16Value) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = Bf16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f))));
      continue;
    }
    ASSERT_EQ(F32ToBf16(f), bits) << bits;
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 lies between 1.0078125 (odd) and 1.015625 (even): goes up.
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3.0f / 256)), 1.015625f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256 + 1e-6f)), 1.0078125f);
}

TEST(DTypeTest, F16RoundTripsEveryF16Value) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = F16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), bits) << std::hex << bits;
  }
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                // overflows to inf
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);   // tie to even: 0
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -26)), 0x0001);   // 0.75 ulp rounds up
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, ParsesNamesAndAliases) {
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(ParseDType("float32"), DType::kF32);
  EXPECT_EQ(ParseDType("F16"), DType::kF16);
  EXPECT_FALSE(ParseDType("complex64").has_value());
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
}

}  // namespace
}  // namespace kvmesh
