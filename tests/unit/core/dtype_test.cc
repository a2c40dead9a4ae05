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

TEST(DTypeTest, Fp8E4M3RoundTripsEveryCode) {
  for (uint32_t bits = 0; bits < 0x100; ++bits) {
    const float f = Fp8E4M3ToF32(static_cast<uint8_t>(bits));
    if ((bits & 0x7f) == 0x7f) {  // the two NaN codes
      EXPECT_TRUE(std::isnan(f)) << bits;
      EXPECT_EQ(F32ToFp8E4M3(f), 0x7f) << bits;
      continue;
    }
    ASSERT_FALSE(std::isnan(f)) << bits;
    ASSERT_EQ(F32ToFp8E4M3(f), bits) << std::hex << bits;
  }
}

TEST(DTypeTest, Fp8E4M3KnownValues) {
  EXPECT_EQ(F32ToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(F32ToFp8E4M3(-2.0f), 0xc0);
  EXPECT_EQ(F32ToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(-448.0f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(Fp8E4M3ToF32(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4M3ToF32(0x80)));
  // Ties go to the even code: 1 + 1/16 lies between 1.0 (0x38) and 1.125 (0x39).
  EXPECT_EQ(F32ToFp8E4M3(1.0625f), 0x38);
  // 1.125 + 1/16 lies between 0x39 (odd) and 1.25 (0x3a): goes up.
  EXPECT_EQ(F32ToFp8E4M3(1.1875f), 0x3a);
  EXPECT_EQ(F32ToFp8E4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
  // Subnormal ties: 2^-10 (half the smallest subnormal) goes to 0, 3 * 2^-10 to 2 * 2^-9.
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);
  EXPECT_EQ(F32ToFp8E4M3(-std::ldexp(1.0f, -12)), 0x80);  // underflow keeps the sign
  // Saturation: 464 (448 + half an ulp) is a tie that rounds to 448; above it, and inf, saturate.
  EXPECT_EQ(F32ToFp8E4M3(464.0f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(500.0f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(-1e30f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  // NaN: CUDA's canonical 0x7f whatever the sign.
  EXPECT_EQ(F32ToFp8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(F32ToFp8E4M3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
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
