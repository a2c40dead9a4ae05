#include "embedding/embedding.h"

#include "embedding/embedding_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchEmbedding(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                            int64_t vocab, int64_t hidden, float* out, cudaStream_t stream) {
  if (vocab <= 0 || hidden <= 0 || num_tokens < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid = embedding::EmbeddingGrid(num_tokens, hidden);
  if (dtype == EmbeddingDType::kF32) {
    embedding::EmbeddingKernel<float><<<grid, embedding::kThreads, 0, stream>>>(
        ids, static_cast<const float*>(table), dtype, vocab, hidden, out);
  } else {
    embedding::EmbeddingKernel<uint16_t><<<grid, embedding::kThreads, 0, stream>>>(
        ids, static_cast<const uint16_t*>(table), dtype, vocab, hidden, out);
  }
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
