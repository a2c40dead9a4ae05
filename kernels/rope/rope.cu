#include "rope/rope.h"

#include "rope/rope_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchRopeF32(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                          int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > rope::kMaxHeadDim || num_heads < 0 || num_kv_heads < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  rope::RopeKernel<<<rope::RopeGrid(num_tokens), rope::kThreads, 0, stream>>>(
      q, k, positions, inv_freq, static_cast<int>(num_heads), static_cast<int>(num_kv_heads),
      static_cast<int>(head_dim));
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
