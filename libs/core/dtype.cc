#include "core/dtype.h"

#include <bit>
#include <cmath>

namespace kvmesh {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kInt8: return "int8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "float" || n == "F32") return DType::kF32;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::kBF16;
  if (n == "f16" || n == "float16" || n == "half" || n == "F16") return DType::kF16;
  if (n == "fp8" || n == "fp8_e4m3" || n == "F8_E4M3") return DType::kFP8E4M3;
  if (n == "int8" || n == "I8") return DType::kInt8;
  if (n == "int32" || n == "I32") return DType::kInt32;
  if (n == "int64" || n == "I64") return DType::kInt64;
  if (n == "uint8" || n == "U8") return DType::kUInt8;
  if (n == "bool" || n == "BOOL") return DType::kBool;
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise into an f32 normal
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;  // inf / NaN
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t F32ToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: scale so that one f16 subnormal ulp (2^-24) is 1.0,
    // then let the FPU round to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

uint8_t F32ToFp8E4M3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;            // NaN: CUDA's canonical NaN, no sign
  if (abs > 0x43e80000u) return sign | 0x7eu;    // > 464 (and inf): saturate to 448
  if (abs < 0x3c800000u) {
    // Below 2^-6, the smallest normal: scale so that one subnormal ulp (2^-9) is 1.0 and
    // let the FPU round to nearest even (exact scaling; 8 is the smallest normal, 0x08).
    const float scaled = std::bit_cast<float>(abs) * 512.0f;
    return sign | static_cast<uint8_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits to
  // nearest even. 464 itself is a tie that rounds to 448 (even), so no carry reaches 0x7f.
  const uint32_t rebased = abs - ((127u - 7u) << 23);
  const uint32_t rounded = rebased + 0x7ffffu + ((rebased >> 20) & 1u);
  return sign | static_cast<uint8_t>(rounded >> 20);
}

float Fp8E4M3ToF32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: m * 2^-9
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | (exponent + 127u - 7u) << 23 | mantissa << 20);
}

}  // namespace kvmesh
