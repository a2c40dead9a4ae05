// Moving 8 consecutive pool elements (16 bytes once in bf16) from the paged pool into a
// shared-memory tile as bf16, for each pool element type:
//  - bf16: cp.async, 16 bytes straight to shared memory (asynchronous; the caller commits
//    and waits on the group),
//  - f32: two 16-byte loads, rounded to bf16 (nearest even), one 16-byte shared store,
//  - FP8 e4m3: one 8-byte load, decoded with the KV head's scale (DecodeKv), rounded to bf16.
// `valid` false writes zeros and reads nothing: positions past the context may sit in blocks
// the table does not name, and a zero V row keeps 0 * garbage (NaN) out of P.V.
#pragma once

#include <cstdint>

#include "common/kv_cache_element.cuh"
#include "paged_attention_prefill/mma_bf16.cuh"

namespace kvmesh::kernels::prefill {

__device__ __forceinline__ void StoreChunkBf16(uint16_t* dst, const uint16_t* src, bool valid, float /*scale*/) {
  CpAsync16(dst, src, valid);
}

__device__ __forceinline__ void StoreChunkBf16(uint16_t* dst, const float* src, bool valid, float /*scale*/) {
  uint4 packed = make_uint4(0u, 0u, 0u, 0u);
  if (valid) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    packed = make_uint4(PackBf16x2(a.x, a.y), PackBf16x2(a.z, a.w), PackBf16x2(b.x, b.y), PackBf16x2(b.z, b.w));
  }
  *reinterpret_cast<uint4*>(dst) = packed;
}

__device__ __forceinline__ uint32_t DecodeFp8PairToBf16x2(uint32_t word, int pair, float scale) {
  const float lo = DecodeKv(static_cast<uint8_t>(word >> (16 * pair)), scale);
  const float hi = DecodeKv(static_cast<uint8_t>(word >> (16 * pair + 8)), scale);
  return PackBf16x2(lo, hi);
}

__device__ __forceinline__ void StoreChunkBf16(uint16_t* dst, const uint8_t* src, bool valid, float scale) {
  uint4 packed = make_uint4(0u, 0u, 0u, 0u);
  if (valid) {
    // Little-endian: byte i of the 8 is element i.
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(src));
    packed = make_uint4(DecodeFp8PairToBf16x2(raw.x, 0, scale), DecodeFp8PairToBf16x2(raw.x, 1, scale),
                        DecodeFp8PairToBf16x2(raw.y, 0, scale), DecodeFp8PairToBf16x2(raw.y, 1, scale));
  }
  *reinterpret_cast<uint4*>(dst) = packed;
}

}  // namespace kvmesh::kernels::prefill
