#include "dense_attention/dense_attention.h"

#include "dense_attention/dense_attention_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchDenseAttentionF32(const float* q, const float* k_cache, const float* v_cache,
                                    const int32_t* positions, int64_t num_tokens, int64_t num_heads,
                                    int64_t num_kv_heads, int64_t head_dim, float scale, float* out,
                                    cudaStream_t stream) {
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      head_dim > dense_attention::kThreads * dense_attention::kMaxDimsPerThread || num_heads % num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  dense_attention::DenseAttentionKernel<<<dense_attention::DenseAttentionGrid(num_tokens, num_heads),
                                          dense_attention::kThreads, 0, stream>>>(
      q, k_cache, v_cache, positions, num_heads, num_kv_heads, head_dim, scale, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
