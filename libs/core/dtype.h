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

// Element `i` of contiguous float data `p` (f32, bf16 or f16) widened to f32, exactly;
// 0 for any other dtype.
inline float LoadAsF32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    default: return 0.0f;
  }
}

// FP8 e4m3 bits (OCP "e4m3fn", torch.float8_e4m3fn, CUDA's __NV_E4M3): bias 7, no
// infinities, 0x7f / 0xff are NaN, largest finite +-448, smallest subnormal 2^-9.
// F32ToFp8E4M3 rounds to nearest even and saturates like cuda_fp8.h's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), bit for bit: a finite value of
// magnitude > 464 (448 + half an ulp) and +-inf become +-448 (0x7e / 0xfe); every NaN
// becomes 0x7f (sign dropped, as CUDA canonicalises NaN first); values that underflow
// keep their sign (+-0). Fp8E4M3ToF32 is exact (NaN codes give a quiet NaN with the sign).
uint8_t F32ToFp8E4M3(float f);
float Fp8E4M3ToF32(uint8_t bits);

}  // namespace kvmesh
