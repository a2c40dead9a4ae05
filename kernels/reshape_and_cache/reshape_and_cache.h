// Writes new tokens' keys and values into one layer's paged KV pool (vLLM's
// reshape_and_cache), in exactly the layout of libs/kv/kv_layout.h:
//
//   layer pool = [num_blocks][2 (K, V)][num_kv_heads][B x D]
//   K head of a block: [head_dim][block_size_tokens]  (dimension-major)
//   V head of a block: [block_size_tokens][head_dim]  (token-major)
//
// Token slot s = block * B + offset. Raw pointers + cudaStream_t only: kernels/ includes
// no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// Shape of one layer's pool and of the rows written into it.
struct KvCacheShape {
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size_tokens = 0;
};

// Writes row t of k and v into slot slots[t]; a negative slot skips the row (padding).
//   k, v:     [num_tokens, num_kv_heads, head_dim] f32, device memory
//   slots:    [num_tokens] int64, device memory, each < num_blocks * block_size_tokens
//   kv_cache: one layer's pool, f32 elements (the F32 launcher) or bf16 bits rounded to
//             nearest even, NaN kept quiet with its sign, bit for bit as F32ToBf16 in
//             core/dtype.h (the Bf16 launcher)
// Two tokens must not share a slot. cudaErrorInvalidValue for a non-positive dimension
// or more than 2^31 - 1 tokens or num_kv_heads * head_dim elements per row.
cudaError_t LaunchReshapeAndCacheF32(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                     const KvCacheShape& shape, float* kv_cache, cudaStream_t stream);
cudaError_t LaunchReshapeAndCacheBf16(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                      const KvCacheShape& shape, uint16_t* kv_cache, cudaStream_t stream);
// FP8 e4m3 pool with a per-KV-head scale: element = e4m3(x / scale[head]), rounded to
// nearest even and saturated to +-448, NaN -> 0x7f: bit for bit core/dtype.h's
// F32ToFp8E4M3(x / scale) (kv_cache_element.cuh's EncodeKv, which the readers decode as
// e4m3 * scale). Within range the round trip is within half an e4m3 ulp: relative 2^-4.
//   k_scale, v_scale: [num_kv_heads] f32, device memory, finite and > 0
// cudaErrorInvalidValue also for a null scale pointer.
cudaError_t LaunchReshapeAndCacheFp8(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                     const KvCacheShape& shape, const float* k_scale, const float* v_scale,
                                     uint8_t* kv_cache, cudaStream_t stream);

}  // namespace kvmesh::kernels
