// The f32 -> bf16 / f16 cast kernel (cast.h). Included by cast.cu and by the host emulation
// test.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/kv_cache_element.cuh"

namespace kvmesh::kernels::cast {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 4096;

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

// The launch's grid. Grid-stride: a few waves of blocks cover any n without a huge grid.
inline dim3 CastGrid(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

}  // namespace kvmesh::kernels::cast
