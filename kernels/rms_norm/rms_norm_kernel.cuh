// The RMSNorm kernel (rms_norm.h): one block of kThreads per token; plain or fused with the
// residual add, f32 or bf16 weights. Included by rms_norm.cu and by the host emulation test.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvmesh::kernels::rms_norm {

inline constexpr int kThreads = 256;

__device__ __forceinline__ float WeightToF32(float w) { return w; }
__device__ __forceinline__ float WeightToF32(__nv_bfloat16 w) { return __bfloat162float(w); }

// Sum of `v` over the block (kThreads threads); every thread gets the result.
__device__ inline float BlockSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __shared__ float warp_sums[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) warp_sums[0] = v;
  }
  __syncthreads();
  return warp_sums[0];
}

// One block per token: (optionally residual += x, then) a block-wide sum of squares, then a
// scaled write. With kAddResidual the normalised row is `residual`, else `x`. No
// __restrict__: out may alias x or residual, and each element is only ever touched by the
// thread that owns index i.
template <typename W, bool kAddResidual>
__global__ void __launch_bounds__(kThreads) RmsNormKernel(float* residual, const float* x, const W* __restrict__ weight,
                                                          float eps, int64_t hidden, float* out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    float v = x[row + i];
    if constexpr (kAddResidual) {
      v += residual[row + i];
      residual[row + i] = v;
    }
    sum += v * v;
  }
  const float inv_rms = rsqrtf(BlockSum(sum) / static_cast<float>(hidden) + eps);
  const float* normed = kAddResidual ? residual : x;
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    out[row + i] = normed[row + i] * inv_rms * WeightToF32(weight[i]);
  }
}

// The launch's grid: one block per token.
inline dim3 RmsNormGrid(int64_t num_tokens) { return dim3(static_cast<unsigned>(num_tokens)); }

}  // namespace kvmesh::kernels::rms_norm
