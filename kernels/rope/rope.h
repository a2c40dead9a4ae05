// Rotary position embedding, Hugging Face "rotate_half" style, in place on q and k.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// For token t and each head, pairs (i, i + D/2) are rotated by the angle
// positions[t] * inv_freq[i], that product rounded to f32 (as transformers computes it),
// then its cos and sin taken in f32 (CUDA's sincosf, within 2 ulp; the reference backend
// rounds the f64 result). Any RoPE scaling (llama3, linear, ...) is already folded into
// inv_freq.
//   q:         [num_tokens, num_heads, head_dim] f32, rotated in place
//   k:         [num_tokens, num_kv_heads, head_dim] f32, rotated in place
//   positions: [num_tokens] int32, device memory
//   inv_freq:  [head_dim / 2] f32, device memory
// head_dim must be even and at most 1024. Returns cudaErrorInvalidValue otherwise.
cudaError_t LaunchRopeF32(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                          int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, cudaStream_t stream);

}  // namespace kvmesh::kernels
