#include "gather_rows/gather_rows.h"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

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

}  // namespace

cudaError_t LaunchGatherAddRowsF32(const float* a, const float* b, const int32_t* rows, int64_t num_rows,
                                   int64_t width, float* out, cudaStream_t stream) {
  if (num_rows < 0 || width < 0) return cudaErrorInvalidValue;
  if (num_rows == 0 || width == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_rows), static_cast<unsigned>((width + kThreads - 1) / kThreads));
  GatherAddRowsKernel<<<grid, kThreads, 0, stream>>>(a, b, rows, width, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
