// Element types kvmesh stores and computes with, and exact scalar conversions.
//
// bf16 and f16 values are carried as their raw 16-bit patterns (uint16_t) so
// that no compiler extension type leaks into interfaces. f32 -> bf16/f16 rounds
// to nearest, ties to even, as PyTorch and Hugging Face do; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvmesh {

enum class DType : uint8_t { kF32, kBF16, kF16, kFP8E4M3, kInt8, kInt32, kInt64, kUInt8, kBool };

// Bytes per element.
constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kFP8E4M3: return 1;
    case DType::kInt8: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kBool: return 1;
  }
  return 0;
}

// "f32", "bf16", ... as kvmesh prints them.
std::string_view DTypeName(DType t);
// Accepts kvmesh names and common aliases ("float32", "bfloat16", "float16", "half").
std::optional<DType> ParseDType(std::string_view name);

inline float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// Rounds an f32 to the nearest bf16 value and back (what storing as bf16 does).
inline float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float f);

}  // namespace kvmesh
