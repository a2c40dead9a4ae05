// The block-copy kernel (copy_blocks.h). Included by copy_blocks.cu and by the host
// emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "copy_blocks/copy_blocks.h"

namespace kvmesh::kernels::copy_blocks {

inline constexpr int kThreads = 256;

// Grid (num_pairs, num_layers): one block copies one block of one layer in units of U
// (uint4: 16 bytes, or unsigned char).
template <typename U>
__global__ void __launch_bounds__(kThreads) CopyBlocksKernel(char* pool, BlockPoolShape shape,
                                                             const int32_t* __restrict__ block_pairs) {
  const int32_t src = block_pairs[2 * blockIdx.x];
  const int32_t dst = block_pairs[2 * blockIdx.x + 1];
  if (src == dst) return;
  char* layer = pool + static_cast<int64_t>(blockIdx.y) * shape.layer_bytes;
  const U* from = reinterpret_cast<const U*>(layer + src * shape.block_bytes);
  U* to = reinterpret_cast<U*>(layer + dst * shape.block_bytes);
  const int64_t n = shape.block_bytes / static_cast<int64_t>(sizeof(U));
  for (int64_t i = threadIdx.x; i < n; i += kThreads) to[i] = from[i];
}

// The launch's grid (num_pairs, num_layers).
inline dim3 CopyBlocksGrid(int64_t num_pairs, const BlockPoolShape& shape) {
  return dim3(static_cast<unsigned>(num_pairs), static_cast<unsigned>(shape.num_layers));
}

// Whether the launch copies in 16-byte units (CopyBlocksKernel<uint4>): every block of every
// layer starts 16-byte aligned.
inline bool CopiesInUint4(const void* pool, const BlockPoolShape& shape) {
  return reinterpret_cast<uintptr_t>(pool) % 16 == 0 && shape.block_bytes % 16 == 0 && shape.layer_bytes % 16 == 0;
}

}  // namespace kvmesh::kernels::copy_blocks
