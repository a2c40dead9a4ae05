#include "silu_and_mul/silu_and_mul.h"

#include "silu_and_mul/silu_and_mul_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchSiluAndMulF32(const float* gate_up, int64_t num_tokens, int64_t intermediate, float* out,
                                cudaStream_t stream) {
  if (num_tokens < 0 || intermediate < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0 || intermediate == 0) return cudaSuccess;
  silu_and_mul::SiluAndMulKernel<<<silu_and_mul::SiluAndMulGrid(num_tokens, intermediate), silu_and_mul::kThreads,
                                   0, stream>>>(gate_up, intermediate, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
