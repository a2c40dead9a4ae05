#include "embedding/embedding.h"

#include <cmath>

#include "embedding/embedding_kernel.cuh"

namespace kvmesh::kernels {
namespace {

// Both launchers: rows first_id .. first_id + vocab - 1 of the vocabulary, `outside` for
// every other id.
cudaError_t Launch(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype, int64_t first_id,
                   int64_t vocab, int64_t hidden, float outside, float* out, cudaStream_t stream) {
  if (vocab <= 0 || hidden <= 0 || num_tokens < 0 || first_id < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid = embedding::EmbeddingGrid(num_tokens, hidden);
  if (dtype == EmbeddingDType::kF32) {
    embedding::EmbeddingKernel<float><<<grid, embedding::kThreads, 0, stream>>>(
        ids, static_cast<const float*>(table), dtype, first_id, vocab, hidden, outside, out);
  } else {
    embedding::EmbeddingKernel<uint16_t><<<grid, embedding::kThreads, 0, stream>>>(
        ids, static_cast<const uint16_t*>(table), dtype, first_id, vocab, hidden, outside, out);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                            int64_t vocab, int64_t hidden, float* out, cudaStream_t stream) {
  return Launch(ids, num_tokens, table, dtype, /*first_id=*/0, vocab, hidden, NAN, out, stream);
}

cudaError_t LaunchEmbeddingShard(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                                 int64_t first_id, int64_t vocab_rows, int64_t hidden, float* out,
                                 cudaStream_t stream) {
  return Launch(ids, num_tokens, table, dtype, first_id, vocab_rows, hidden, 0.f, out, stream);
}

}  // namespace kvmesh::kernels
