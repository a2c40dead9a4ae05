#include "embedding/embedding.h"

#include <cmath>

#include <cuda_fp16.h>

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Widen(uint16_t bits, EmbeddingDType dtype) {
  if (dtype == EmbeddingDType::kBf16) return __uint_as_float(uint32_t{bits} << 16);
  return __half2float(__ushort_as_half(bits));
}

// Grid (T, ceil(hidden / kThreads)): one coalesced pass over one row's slice.
template <typename T>
__global__ void __launch_bounds__(kThreads) EmbeddingKernel(const int32_t* __restrict__ ids,
                                                            const T* __restrict__ table, EmbeddingDType dtype,
                                                            int64_t vocab, int64_t hidden, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j >= hidden) return;
  const int64_t id = ids[t];
  float* row = out + t * hidden;
  if (id < 0 || id >= vocab) {
    row[j] = NAN;
    return;
  }
  if constexpr (sizeof(T) == 4) {
    row[j] = table[id * hidden + j];
  } else {
    row[j] = Widen(table[id * hidden + j], dtype);
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                            int64_t vocab, int64_t hidden, float* out, cudaStream_t stream) {
  if (vocab <= 0 || hidden <= 0 || num_tokens < 0) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
  if (dtype == EmbeddingDType::kF32) {
    EmbeddingKernel<float><<<grid, kThreads, 0, stream>>>(ids, static_cast<const float*>(table), dtype, vocab,
                                                          hidden, out);
  } else {
    EmbeddingKernel<uint16_t><<<grid, kThreads, 0, stream>>>(ids, static_cast<const uint16_t*>(table), dtype,
                                                             vocab, hidden, out);
  }
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
