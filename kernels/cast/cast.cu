#include "cast/cast.h"

#include <cuda_fp16.h>

#include "common/kv_cache_element.cuh"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) CastKernel(const float* __restrict__ in, int64_t n,
                                                       uint16_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    if constexpr (kBf16) {
      out[i] = FloatToBf16Bits(in[i]);
    } else {
      out[i] = __half_as_ushort(__float2half_rn(in[i]));
    }
  }
}

template <bool kBf16>
cudaError_t Launch(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  // Grid-stride: a few waves of blocks cover any n without a huge grid.
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  CastKernel<kBf16><<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCastF32ToBf16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return Launch<true>(in, n, out, stream);
}

cudaError_t LaunchCastF32ToF16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return Launch<false>(in, n, out, stream);
}

}  // namespace kvmesh::kernels
