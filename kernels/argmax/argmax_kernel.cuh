// The row-argmax kernel (argmax.h): the host sampler's greedy rule (NaN never wins, +inf
// counts as FLT_MAX, the lowest index on ties). Included by argmax.cu and by the host
// emulation test.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::argmax {

inline constexpr int kThreads = 512;

__device__ __forceinline__ float Sanitize(float x) {
  if (x != x) return -INFINITY;
  return x > FLT_MAX ? FLT_MAX : x;
}

// (value, index) pairs: the larger value wins, the lower index on ties.
__device__ __forceinline__ void Keep(float& v, int32_t& i, float ov, int32_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block per row. Each thread scans its share in increasing index order (16-byte loads
// when the row allows), keeping the first maximum; then the warps and the block reduce
// the pairs.
__global__ void __launch_bounds__(kThreads) ArgmaxRowsKernel(const float* __restrict__ logits, int64_t vocab,
                                                             int32_t* __restrict__ out) {
  __shared__ float warp_v[kThreads / 32];
  __shared__ int32_t warp_i[kThreads / 32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float v = -INFINITY;
  int32_t i = INT_MAX;
  // 16-byte loads where every row starts 16-byte aligned (a cudaMalloc'd base, or a view
  // into one at a multiple of 4 floats); the same for every block, so no divergence.
  if (vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < vocab / 4; j += kThreads) {
      const float4 x = row4[j];
      const int32_t base = static_cast<int32_t>(4 * j);
      Keep(v, i, Sanitize(x.x), base);
      Keep(v, i, Sanitize(x.y), base + 1);
      Keep(v, i, Sanitize(x.z), base + 2);
      Keep(v, i, Sanitize(x.w), base + 3);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads) Keep(v, i, Sanitize(row[j]), static_cast<int32_t>(j));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, offset);
    Keep(v, i, ov, oi);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) Keep(v, i, warp_v[w], warp_i[w]);
    out[blockIdx.x] = v > -INFINITY ? i : -1;
  }
}

// The launch's grid: one block per row.
inline dim3 ArgmaxRowsGrid(int64_t num_rows) { return dim3(static_cast<unsigned>(num_rows)); }

}  // namespace kvmesh::kernels::argmax
