#include "bias_add/bias_add.h"

#include "bias_add/bias_add_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchBiasAddF32(float* out, const float* bias, int64_t num_rows, int64_t n, cudaStream_t stream) {
  if (num_rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (num_rows == 0 || n == 0) return cudaSuccess;
  bias_add::BiasAddKernel<<<bias_add::BiasAddGrid(num_rows, n), bias_add::kThreads, 0, stream>>>(out, bias, n);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
