#include "bias_add/bias_add.h"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) BiasAddKernel(float* __restrict__ out, const float* __restrict__ bias,
                                                          int64_t n) {
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j < n) out[static_cast<int64_t>(blockIdx.x) * n + j] += bias[j];
}

}  // namespace

cudaError_t LaunchBiasAddF32(float* out, const float* bias, int64_t num_rows, int64_t n, cudaStream_t stream) {
  if (num_rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (num_rows == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_rows), static_cast<unsigned>((n + kThreads - 1) / kThreads));
  BiasAddKernel<<<grid, kThreads, 0, stream>>>(out, bias, n);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
