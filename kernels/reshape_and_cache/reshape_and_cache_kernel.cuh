// The KV-cache write kernel (reshape_and_cache.h): f32, bf16 and FP8 e4m3 pools. Included by
// reshape_and_cache.cu and by the host emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/kv_cache_element.cuh"
#include "reshape_and_cache/reshape_and_cache.h"

namespace kvmesh::kernels::reshape_and_cache {

inline constexpr int kThreads = 128;

// One block per token; threads walk its num_kv_heads * head_dim elements in order, so the
// reads and the V writes are coalesced. K writes are strided by B elements (the K block
// is dimension-major): one token's K cannot be written contiguously in this layout.
// Elements are encoded by kv_cache_element.cuh's EncodeKv, the encoding the pool's
// readers decode; k_scale / v_scale ([num_kv_heads], device) are read for FP8 only.
template <typename T>
__global__ void __launch_bounds__(kThreads) ReshapeAndCacheKernel(const float* __restrict__ k,
                                                                  const float* __restrict__ v,
                                                                  const int64_t* __restrict__ slots,
                                                                  KvCacheShape shape,
                                                                  const float* __restrict__ k_scale,
                                                                  const float* __restrict__ v_scale,
                                                                  T* __restrict__ kv_cache) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t bsz = shape.block_size_tokens;
  const int64_t d = shape.head_dim;
  const int64_t block = slot / bsz;
  const int64_t offset = slot - block * bsz;
  const int64_t head_elems = bsz * d;
  const int64_t row_elems = shape.num_kv_heads * d;
  T* k_block = kv_cache + block * 2 * shape.num_kv_heads * head_elems;  // [Hkv][D][B]
  T* v_block = k_block + shape.num_kv_heads * head_elems;              // [Hkv][B][D]
  // 32-bit index math within the row (Launch checks num_kv_heads * head_dim < 2^31): a
  // 64-bit division per element is a slow subroutine call.
  const int32_t d32 = static_cast<int32_t>(d);
  for (int32_t e = threadIdx.x; e < static_cast<int32_t>(row_elems); e += kThreads) {
    const int32_t h = e / d32;
    const int32_t c = e - h * d32;
    const float ks = k_scale != nullptr ? k_scale[h] : 1.0f;
    const float vs = v_scale != nullptr ? v_scale[h] : 1.0f;
    k_block[h * head_elems + c * bsz + offset] = EncodeKv(k[t * row_elems + e], ks, kv_cache);
    v_block[h * head_elems + offset * d + c] = EncodeKv(v[t * row_elems + e], vs, kv_cache);
  }
}

// The launch's grid: one block per token.
inline dim3 ReshapeAndCacheGrid(int64_t num_tokens) { return dim3(static_cast<unsigned>(num_tokens)); }

}  // namespace kvmesh::kernels::reshape_and_cache
