// The SiLU-and-mul kernel (silu_and_mul.h). Included by silu_and_mul.cu and by the host
// emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::silu_and_mul {

inline constexpr int kThreads = 256;

__device__ __forceinline__ float SiluMul(float a, float b) { return a / (1.f + expf(-a)) * b; }

// Grid (T, ceil(I / (4 * kThreads))): each block covers 4 * kThreads outputs of one row,
// as one float4 per thread when the row allows (I % 4 == 0), else as 4 coalesced passes.
__global__ void __launch_bounds__(kThreads) SiluAndMulKernel(const float* __restrict__ gate_up,
                                                             int64_t intermediate, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const float* gate = gate_up + t * 2 * intermediate;
  const float* up = gate + intermediate;
  float* o = out + t * intermediate;
  const int64_t base = static_cast<int64_t>(blockIdx.y) * kThreads * 4;
  if (intermediate % 4 == 0) {  // rows stay 16-byte aligned (cudaMalloc'd base)
    const int64_t i = base + threadIdx.x * 4;
    if (i >= intermediate) return;
    const float4 g = *reinterpret_cast<const float4*>(gate + i);
    const float4 u = *reinterpret_cast<const float4*>(up + i);
    *reinterpret_cast<float4*>(o + i) =
        make_float4(SiluMul(g.x, u.x), SiluMul(g.y, u.y), SiluMul(g.z, u.z), SiluMul(g.w, u.w));
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + k * kThreads + threadIdx.x;
    if (i < intermediate) o[i] = SiluMul(gate[i], up[i]);
  }
}

// The launch's grid (T, ceil(I / (4 * kThreads))).
inline dim3 SiluAndMulGrid(int64_t num_tokens, int64_t intermediate) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * 4;
  return dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>((intermediate + per_block - 1) / per_block));
}

}  // namespace kvmesh::kernels::silu_and_mul
