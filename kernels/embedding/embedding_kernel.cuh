// The embedding-lookup kernel (embedding.h): f32, bf16 and f16 tables. Included by
// embedding.cu and by the host emulation test.
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

// The launch's grid (T, ceil(hidden / kThreads)).
inline dim3 EmbeddingGrid(int64_t num_tokens, int64_t hidden) {
  return dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>((hidden + kThreads - 1) / kThreads));
}

}  // namespace kvmesh::kernels::embedding
