// The embedding-lookup kernel (embedding.h): f32, bf16 and f16 tables, whole or one
// vocab-parallel shard. Included by embedding.cu and by the host emulation test.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "embedding/embedding.h"

namespace kvmesh::kernels::embedding {

inline constexpr int kThreads = 256;

__device__ __forceinline__ float Widen(uint16_t bits, EmbeddingDType dtype) {
  if (dtype == EmbeddingDType::kBf16) return __uint_as_float(uint32_t{bits} << 16);
  return __half2float(__ushort_as_half(bits));
}

// Grid (T, ceil(hidden / kThreads)): one coalesced pass over one row's slice. The table
// holds the rows of ids first_id .. first_id + vocab - 1 (first_id 0: the whole vocabulary);
// any other id's row is `outside` (NaN for a full table, 0 for a vocab-parallel shard).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const int32_t* __restrict__ ids, const T* __restrict__ table, EmbeddingDType dtype,
                    int64_t first_id, int64_t vocab, int64_t hidden, float outside, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j >= hidden) return;
  const int64_t row_id = ids[t] - first_id;
  float* row = out + t * hidden;
  if (row_id < 0 || row_id >= vocab) {
    row[j] = outside;
    return;
  }
  if constexpr (sizeof(T) == 4) {
    row[j] = table[row_id * hidden + j];
  } else {
    row[j] = Widen(table[row_id * hidden + j], dtype);
  }
}

// The launch's grid (T, ceil(hidden / kThreads)).
inline dim3 EmbeddingGrid(int64_t num_tokens, int64_t hidden) {
  return dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
}

}  // namespace kvmesh::kernels::embedding
