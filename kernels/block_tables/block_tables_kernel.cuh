// The block-table kernels (block_tables.h). Included by block_tables.cu and by the host
// emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels::block_tables {

inline constexpr int kThreads = 256;

// Grid ceil(num_updates / kThreads): one pair per thread.
__global__ void __launch_bounds__(kThreads) ApplyUpdatesKernel(const int32_t* __restrict__ updates,
                                                               int64_t num_updates, int32_t* __restrict__ row_array) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= num_updates) return;
  row_array[updates[2 * i]] = updates[2 * i + 1];
}

// Grid (num_seqs, ceil(out_cols / kThreads)): one output entry per thread.
__global__ void __launch_bounds__(kThreads) GatherRowsKernel(const int32_t* __restrict__ row_array,
                                                             int64_t row_stride, const int32_t* __restrict__ rows,
                                                             const int32_t* __restrict__ context_lens,
                                                             int32_t block_size_tokens, int64_t out_cols,
                                                             int32_t* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (j >= out_cols) return;
  const int32_t r = rows[i];
  const int64_t blocks = (static_cast<int64_t>(context_lens[i]) + block_size_tokens - 1) / block_size_tokens;
  out[i * out_cols + j] = r >= 0 && j < blocks && j < row_stride ? row_array[r * row_stride + j] : 0;
}

inline dim3 ApplyUpdatesGrid(int64_t num_updates) {
  return dim3(static_cast<unsigned>((num_updates + kThreads - 1) / kThreads));
}
inline dim3 GatherRowsGrid(int64_t num_seqs, int64_t out_cols) {
  return dim3(static_cast<unsigned>(num_seqs), static_cast<unsigned>((out_cols + kThreads - 1) / kThreads));
}

}  // namespace kvmesh::kernels::block_tables
