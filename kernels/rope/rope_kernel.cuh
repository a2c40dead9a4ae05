// The RoPE kernel (rope.h). Included by rope.cu and by the host emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::rope {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxHeadDim = 1024;

// One block per token: the D/2 cos/sin pairs go to shared memory once, then the block
// rotates every (head, i) pair of q and then k. Each pair is read and written by one thread.
__global__ void __launch_bounds__(kThreads) RopeKernel(float* __restrict__ q, float* __restrict__ k,
                                                       const int32_t* __restrict__ positions,
                                                       const float* __restrict__ inv_freq, int num_heads,
                                                       int num_kv_heads, int head_dim) {
  __shared__ float cos_sin[kMaxHeadDim];  // [half] cos, then [half] sin
  const int half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float angle = __fmul_rn(pos, inv_freq[i]);  // rounded to f32, never contracted
    sincosf(angle, &cos_sin[half + i], &cos_sin[i]);
  }
  __syncthreads();
  const int q_pairs = num_heads * half;
  const int total = (num_heads + num_kv_heads) * half;
  for (int p = threadIdx.x; p < total; p += kThreads) {
    const bool is_q = p < q_pairs;
    const int local = is_q ? p : p - q_pairs;
    const int head = local / half;
    const int i = local - head * half;
    float* v = is_q ? q + (t * num_heads + head) * head_dim : k + (t * num_kv_heads + head) * head_dim;
    const float x1 = v[i];
    const float x2 = v[i + half];
    const float c = cos_sin[i];
    const float s = cos_sin[half + i];
    // As the reference: x1*c - x2*s rounded per product (no fma), to stay within an ulp.
    v[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

// The launch's grid: one block per token.
inline dim3 RopeGrid(int64_t num_tokens) { return dim3(static_cast<unsigned>(num_tokens)); }

}  // namespace kvmesh::kernels::rope
