// Wide loads of the paged KV pool and their widening to f32, per pool element type: one
// load brings kElems consecutive elements (TC tokens of one K row, or TC dimensions of one
// V row). f32 and bf16 load 16 bytes; fp8 loads 8 (16 would need 16 accumulators per head
// and token, too many registers at group 8). Decoding is exact; the fp8 scale is applied by
// the caller (folded into q for K, into the output for V).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "common/kv_cache_element.cuh"

namespace kvmesh::kernels::paged_attention_decode {

template <typename T>
struct KvVector;

template <>
struct KvVector<float> {
  static constexpr int kElems = 4;
  using Raw = uint4;
  __device__ __forceinline__ static Raw Load(const float* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ static void Decode(const Raw& r, float (&x)[kElems]) {
    x[0] = __uint_as_float(r.x);
    x[1] = __uint_as_float(r.y);
    x[2] = __uint_as_float(r.z);
    x[3] = __uint_as_float(r.w);
  }
};

template <>
struct KvVector<uint16_t> {
  static constexpr int kElems = 8;
  using Raw = uint4;
  __device__ __forceinline__ static Raw Load(const uint16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  // Element 2i is the low half of word i (little endian); bf16 -> f32 is a shift.
  __device__ __forceinline__ static void Decode(const Raw& r, float (&x)[kElems]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

template <>
struct KvVector<uint8_t> {
  static constexpr int kElems = 8;
  using Raw = uint2;
  __device__ __forceinline__ static Raw Load(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
  // Two e4m3 at a time (cvt.rn.f16x2.e4m3x2 on sm_89+): the low byte is the lower element.
  // Bit for bit Fp8E4M3BitsToFloat of kv_cache_element.cuh, without the scale.
  __device__ __forceinline__ static void Decode(const Raw& r, float (&x)[kElems]) {
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const auto pair = static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * j)) & 0xffffu);
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(__half2(h));
        x[4 * i + 2 * j] = f.x;
        x[4 * i + 2 * j + 1] = f.y;
      }
    }
  }
};

// Reads kN consecutive f32 of shared memory (16-byte aligned when kN % 4 == 0) into registers.
template <int kN>
__device__ __forceinline__ void LoadSharedRow(const float* p, float (&x)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      x[4 * i] = v.x;
      x[4 * i + 1] = v.y;
      x[4 * i + 2] = v.z;
      x[4 * i + 3] = v.w;
    }
  } else if constexpr (kN == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x;
    x[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = p[i];
  }
}

}  // namespace kvmesh::kernels::paged_attention_decode
