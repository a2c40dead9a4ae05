// The block-swap kernel (swap_blocks.h: LaunchSwapBlocks, one launch for all pairs and
// layers). Included by swap_blocks.cu and by the host emulation test.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "copy_blocks/copy_blocks.h"

namespace kvmesh::kernels::swap_blocks {

inline constexpr int kThreads = 256;
// 16-byte units each thread loads before it stores any: independent reads in flight hide
// the latency of the host link (~1-2 us per read over PCIe), which one load at a time
// per thread would expose.
inline constexpr int kUnroll = 4;

// Grid (num_pairs, num_layers): CTA (p, l) copies block pair p of layer l in units of U
// (uint4: 16 bytes, or unsigned char). src_blocks / dst_blocks: ids each side holds.
template <typename U>
__global__ void __launch_bounds__(kThreads) SwapBlocksKernel(const char* __restrict__ src_pool,
                                                             char* __restrict__ dst_pool, int64_t src_layer_bytes,
                                                             int64_t dst_layer_bytes, int64_t block_bytes,
                                                             int64_t src_blocks, int64_t dst_blocks,
                                                             const int32_t* __restrict__ block_pairs) {
  const int64_t pair = blockIdx.x;
  const int64_t src = block_pairs[2 * pair];
  const int64_t dst = block_pairs[2 * pair + 1];
  if (src < 0 || src >= src_blocks || dst < 0 || dst >= dst_blocks) return;  // whole CTA: no barrier below
  const int64_t layer = blockIdx.y;
  const U* from = reinterpret_cast<const U*>(src_pool + layer * src_layer_bytes + src * block_bytes);
  U* to = reinterpret_cast<U*>(dst_pool + layer * dst_layer_bytes + dst * block_bytes);
  const int64_t n = block_bytes / static_cast<int64_t>(sizeof(U));
  constexpr int64_t kStride = int64_t{kThreads} * kUnroll;
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kStride) {
    U staged[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) staged[u] = from[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) to[i + u * kThreads] = staged[u];
  }
  for (; i < n; i += kThreads) to[i] = from[i];
}

// The launch's grid (num_pairs, num_layers).
inline dim3 SwapBlocksGrid(int64_t num_pairs, const BlockPoolShape& src_shape) {
  return dim3(static_cast<unsigned>(num_pairs), static_cast<unsigned>(src_shape.num_layers));
}

// Whether the launch copies in 16-byte units (SwapBlocksKernel<uint4>): both pools and every
// block of every layer on both sides start 16-byte aligned.
inline bool SwapsInUint4(const void* src_pool, const void* dst_pool, const BlockPoolShape& src_shape,
                         const BlockPoolShape& dst_shape) {
  return reinterpret_cast<uintptr_t>(src_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(dst_pool) % 16 == 0 &&
         src_shape.block_bytes % 16 == 0 && src_shape.layer_bytes % 16 == 0 && dst_shape.layer_bytes % 16 == 0;
}

}  // namespace kvmesh::kernels::swap_blocks
