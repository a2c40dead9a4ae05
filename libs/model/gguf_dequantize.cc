#include "model/gguf_dequantize.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "model/gguf_file.h"

namespace kvmesh::model {
namespace {

constexpr int kQK = 256;  // QK_K: elements of a K-quant super-block

float Half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}

// Q8_0: [d f16][32 x int8]; x = d * q.
void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
}

// Q4_0: [d f16][16 bytes]; low nibbles are elements 0..15, high 16..31; x = d * (q - 8).
void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(static_cast<int>(qs[i] & 0x0F) - 8);
    y[i + 16] = d * static_cast<float>(static_cast<int>(qs[i] >> 4) - 8);
  }
}

// Q4_1: [d f16][m f16][16 bytes]; x = d * q + m (two roundings).
void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    const float lo = d * static_cast<float>(qs[i] & 0x0F);
    const float hi = d * static_cast<float>(qs[i] >> 4);
    y[i] = lo + m;
    y[i + 16] = hi + m;
  }
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12 packed bytes).
void ScaleMinK4(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q4_K: [d f16][dmin f16][scales 12][qs 128]; sub-block j of 32 has
// scale d*sc[j], min dmin*m[j]; x = (d*sc) * q - (dmin*m).
void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(scales, j, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const float v = dj * static_cast<float>((q[l] >> shift) & 0x0F);
      y[32 * j + l] = v - mj;
    }
  }
}

// Q5_K: [d][dmin][scales 12][qh 32][qs 128]; the fifth bit of sub-block j's
// element l is bit j of qh[l].
void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ScaleMinK4(scales, j, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] >> shift) & 0x0F;
      const int hi = (qh[l] >> j) & 1;
      const float v = dj * static_cast<float>(lo | (hi << 4));
      y[32 * j + l] = v - mj;
    }
  }
}

// Q6_K: [ql 128][qh 64][scales 16 x int8][d f16]; element p of the 256:
// half h = p/128, low 4 bits from ql[64h + p%64] (nibble (p%128)/64), high 2
// bits from qh[32h + p%32] (pair (p%128)/32); x = (d * scale[p/16]) * (q - 32).
void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  float ds[16];
  for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(scales[i]);
  for (int p = 0; p < kQK; ++p) {
    const int h = p / 128, r = p % 128;
    const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    const int q = (lo | (hi << 4)) - 32;
    y[p] = ds[p / 16] * static_cast<float>(q);
  }
}

}  // namespace

bool CanDequantize(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

absl::Status DequantizeToF32(uint32_t ggml_type, std::span<const uint8_t> data, std::span<float> out) {
  const std::optional<GgmlTypeLayout> layout = LayoutOf(ggml_type);
  if (!layout || !CanDequantize(ggml_type)) {
    return absl::InvalidArgumentError(absl::StrCat("ggml type ", layout ? layout->name : "", " (", ggml_type,
                                                   ") cannot be dequantized (supported: F32, F16, BF16, Q8_0, "
                                                   "Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)"));
  }
  const int64_t n = static_cast<int64_t>(out.size());
  if (n % layout->block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(n, " elements are not a whole number of ", layout->name,
                                                   " blocks of ", layout->block_elements));
  }
  const int64_t blocks = n / layout->block_elements;
  if (static_cast<int64_t>(data.size()) != blocks * layout->block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(n, " ", layout->name, " elements take ",
                                                   blocks * layout->block_bytes, " bytes, got ", data.size()));
  }
  const uint8_t* src = data.data();
  float* dst = out.data();
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kF32:
      std::memcpy(dst, src, data.size());
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Half(src + 2 * i);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = Bf16ToF32(bits);
      }
      break;
    default: {
      void (*decode)(const uint8_t*, float*) = nullptr;
      switch (static_cast<GgmlType>(ggml_type)) {
        case GgmlType::kQ8_0: decode = DequantQ8_0; break;
        case GgmlType::kQ4_0: decode = DequantQ4_0; break;
        case GgmlType::kQ4_1: decode = DequantQ4_1; break;
        case GgmlType::kQ4_K: decode = DequantQ4_K; break;
        case GgmlType::kQ5_K: decode = DequantQ5_K; break;
        case GgmlType::kQ6_K: decode = DequantQ6_K; break;
        default: return absl::InternalError("unreachable ggml type");
      }
      for (int64_t b = 0; b < blocks; ++b) {
        decode(src + b * layout->block_bytes, dst + b * layout->block_elements);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeToBf16(uint32_t ggml_type, std::span<const uint8_t> data, std::span<uint16_t> out) {
  // In chunks of 64 Ki elements so the f32 staging stays small.
  const std::optional<GgmlTypeLayout> layout = LayoutOf(ggml_type);
  if (!layout) return DequantizeToF32(ggml_type, data, {});
  const int64_t n = static_cast<int64_t>(out.size());
  const int64_t chunk = layout->block_elements * ((65536 + layout->block_elements - 1) / layout->block_elements);
  if (n % layout->block_elements != 0 ||
      static_cast<int64_t>(data.size()) != n / layout->block_elements * layout->block_bytes) {
    std::vector<float> unused(static_cast<size_t>(n));
    return DequantizeToF32(ggml_type, data, unused);  // for its error message
  }
  std::vector<float> staging(static_cast<size_t>(std::min(n, chunk)));
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    const int64_t byte_begin = begin / layout->block_elements * layout->block_bytes;
    const int64_t byte_count = count / layout->block_elements * layout->block_bytes;
    std::span<float> f32(staging.data(), static_cast<size_t>(count));
    if (absl::Status s = DequantizeToF32(ggml_type, data.subspan(byte_begin, byte_count), f32); !s.ok()) return s;
    for (int64_t i = 0; i < count; ++i) out[begin + i] = F32ToBf16(f32[i]);
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::model
