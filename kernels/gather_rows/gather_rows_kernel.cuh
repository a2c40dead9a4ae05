// The gather-and-add-rows kernel (gather_rows.h). Included by gather_rows.cu and by the host
// emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::gather_rows {

inline constexpr int kThreads = 256;

// Grid (num_rows, ceil(width / kThreads)): out[i, j] = a[rows[i], j] + b[rows[i], j].
__global__ void __launch_bounds__(kThreads) GatherAddRowsKernel(const float* __restrict__ a,
                                                                const float* __restrict__ b,
                                                                const int32_t* __restrict__ rows, int64_t width,
                                                                float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j >= width) return;
  const int64_t src = static_cast<int64_t>(rows[i]) * width + j;
  out[i * width + j] = a[src] + b[src];
}

// The launch's grid (num_rows, ceil(width / kThreads)).
inline dim3 GatherAddRowsGrid(int64_t num_rows, int64_t width) {
  return dim3(static_cast<unsigned>(num_rows), static_cast<unsigned>((width + kThreads - 1) / kThreads));
}

}  // namespace kvmesh::kernels::gather_rows
