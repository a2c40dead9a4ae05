#include "rms_norm/rms_norm.h"

#include <cuda_bf16.h>

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

// One block per token: a block-wide sum of squares, then a scaled write.
__global__ void RmsNormKernel(const float* __restrict__ x, const __nv_bfloat16* __restrict__ weight, float eps,
                              int64_t hidden, float* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * hidden;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) sum += xr[i] * xr[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) warp_sums[0] = sum;
  }
  __syncthreads();
  const float inv_rms = rsqrtf(warp_sums[0] / static_cast<float>(hidden) + eps);
  float* outr = out + row * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) outr[i] = xr[i] * inv_rms * __bfloat162float(weight[i]);
}

}  // namespace

cudaError_t LaunchRmsNormF32Bf16Weight(const float* x, const uint16_t* weight, float eps, int64_t num_tokens,
                                      int64_t hidden, float* out, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(num_tokens), kThreads, 0, stream>>>(
      x, reinterpret_cast<const __nv_bfloat16*>(weight), eps, hidden, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
