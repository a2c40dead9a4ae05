// The dense (contiguous-KV) attention kernel (dense_attention.h). Included by
// dense_attention.cu and by the host emulation test.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::dense_attention {

inline constexpr int kThreads = 128;   // = positions per chunk
inline constexpr int kMaxDimsPerThread = 2;  // head_dim <= 256

__device__ inline float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = fmaxf(r, scratch[w]);
  __syncthreads();
  return r;
}

__device__ inline float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) r += scratch[w];
  __syncthreads();
  return r;
}

// One block per (token, query head). Each chunk: thread i scores position chunk+i, the
// block takes the chunk's max and rescales its running sum and accumulators, then each
// thread accumulates its own output dimensions over the chunk's probabilities.
__global__ void __launch_bounds__(kThreads) DenseAttentionKernel(const float* __restrict__ q,
                                                                 const float* __restrict__ k_cache,
                                                                 const float* __restrict__ v_cache,
                                                                 const int32_t* __restrict__ positions,
                                                                 int64_t num_heads, int64_t num_kv_heads,
                                                                 int64_t head_dim, float scale,
                                                                 float* __restrict__ out) {
  __shared__ float probs[kThreads];
  __shared__ float scratch[kThreads / 32];
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / (num_heads / num_kv_heads);
  const int64_t kv_row = num_kv_heads * head_dim;
  const float* qh = q + (t * num_heads + h) * head_dim;
  const int64_t last = positions[t];
  float acc[kMaxDimsPerThread] = {0.f, 0.f};
  float running_max = -FLT_MAX, running_sum = 0.f;
  for (int64_t chunk = 0; chunk <= last; chunk += kThreads) {
    const int64_t p = chunk + threadIdx.x;
    float s = -FLT_MAX;
    if (p <= last) {
      const float* kp = k_cache + p * kv_row + kvh * head_dim;
      float dot = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kp[d];
      s = dot * scale;
    }
    const float new_max = fmaxf(running_max, BlockMax(s, scratch));
    const float e = p <= last ? expf(s - new_max) : 0.f;
    probs[threadIdx.x] = e;
    const float correction = expf(running_max - new_max);
    running_sum = running_sum * correction + BlockSum(e, scratch);  // BlockSum syncs: probs is visible
    running_max = new_max;
    const int64_t n = last - chunk + 1 < kThreads ? last - chunk + 1 : kThreads;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerThread; ++i) {
      const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
      if (d >= head_dim) continue;
      float a = acc[i] * correction;
      for (int64_t j = 0; j < n; ++j) a += probs[j] * v_cache[(chunk + j) * kv_row + kvh * head_dim + d];
      acc[i] = a;
    }
    __syncthreads();  // probs is rewritten by the next chunk
  }
  float* o = out + (t * num_heads + h) * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerThread; ++i) {
    const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    if (d < head_dim) o[d] = acc[i] / running_sum;
  }
}

// The launch's grid: one block per (token, query head).
inline dim3 DenseAttentionGrid(int64_t num_tokens, int64_t num_heads) {
  return dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>(num_heads));
}

}  // namespace kvmesh::kernels::dense_attention
