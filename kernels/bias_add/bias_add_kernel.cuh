// The bias-add kernel (bias_add.h). Included by bias_add.cu and by the host emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::bias_add {

inline constexpr int kThreads = 256;

// Grid (num_rows, ceil(n / kThreads)): out[row, j] += bias[j].
__global__ void __launch_bounds__(kThreads) BiasAddKernel(float* __restrict__ out, const float* __restrict__ bias,
                                                          int64_t n) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j < n) out[static_cast<int64_t>(blockIdx.x) * n + j] += bias[j];
}

// The launch's grid (num_rows, ceil(n / kThreads)).
inline dim3 BiasAddGrid(int64_t num_rows, int64_t n) {
  return dim3(static_cast<unsigned>(num_rows), static_cast<unsigned>((n + kThreads - 1) / kThreads));
}

}  // namespace kvmesh::kernels::bias_add
