// Causal grouped-query attention over one sequence's dense (unpaged) KV cache: the CUDA
// form of Backend::DenseAttention. A plain, correct kernel, not a fast one: serving runs
// paged attention (kernels/paged_attention_*); this path exists so that every Backend op
// works on the CUDA backend (the single-sequence dense path and its tests).
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// q: [num_tokens, num_heads, head_dim] f32; k_cache, v_cache: [cache_len, num_kv_heads,
// head_dim] f32; positions: [num_tokens] int32, each < cache_len: token t attends to
// cache positions 0..positions[t]; query head h reads KV head h / (num_heads / num_kv_heads).
// out: [num_tokens, num_heads, head_dim] f32. All device memory. f32 throughout with an
// online softmax over chunks of 128 positions. cudaErrorInvalidValue for head_dim > 256 or
// num_heads % num_kv_heads != 0 or a non-positive size.
cudaError_t LaunchDenseAttentionF32(const float* q, const float* k_cache, const float* v_cache,
                                    const int32_t* positions, int64_t num_tokens, int64_t num_heads,
                                    int64_t num_kv_heads, int64_t head_dim, float scale, float* out,
                                    cudaStream_t stream);

}  // namespace kvmesh::kernels
