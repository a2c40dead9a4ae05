#include "swap_blocks/swap_blocks.h"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;
// 16-byte units each thread loads before it stores any: independent reads in flight hide
// the latency of the host link (~1-2 us per read over PCIe), which one load at a time
// per thread would expose.
constexpr int kUnroll = 4;

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

bool ValidShapes(const BlockPoolShape& src, const BlockPoolShape& dst, int64_t num_pairs) {
  return src.num_layers > 0 && src.num_layers == dst.num_layers && src.num_layers <= 65535 && src.block_bytes > 0 &&
         src.block_bytes == dst.block_bytes && src.layer_bytes >= src.block_bytes &&
         dst.layer_bytes >= dst.block_bytes && num_pairs >= 0 && num_pairs <= 0x7fffffff;
}

}  // namespace

cudaError_t LaunchSwapBlocks(const void* src_pool, void* dst_pool, const BlockPoolShape& src_shape,
                             const BlockPoolShape& dst_shape, const int32_t* block_pairs, int64_t num_pairs,
                             cudaStream_t stream) {
  if (!ValidShapes(src_shape, dst_shape, num_pairs)) return cudaErrorInvalidValue;
  if (num_pairs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(src_shape.num_layers));
  const auto* src = static_cast<const char*>(src_pool);
  auto* dst = static_cast<char*>(dst_pool);
  const int64_t src_blocks = src_shape.layer_bytes / src_shape.block_bytes;
  const int64_t dst_blocks = dst_shape.layer_bytes / dst_shape.block_bytes;
  const bool wide = reinterpret_cast<uintptr_t>(src_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(dst_pool) % 16 == 0 &&
                    src_shape.block_bytes % 16 == 0 && src_shape.layer_bytes % 16 == 0 &&
                    dst_shape.layer_bytes % 16 == 0;
  if (wide) {
    SwapBlocksKernel<uint4><<<grid, kThreads, 0, stream>>>(src, dst, src_shape.layer_bytes, dst_shape.layer_bytes,
                                                           src_shape.block_bytes, src_blocks, dst_blocks, block_pairs);
  } else {
    SwapBlocksKernel<unsigned char><<<grid, kThreads, 0, stream>>>(src, dst, src_shape.layer_bytes,
                                                                   dst_shape.layer_bytes, src_shape.block_bytes,
                                                                   src_blocks, dst_blocks, block_pairs);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSwapBlocksMemcpy(const void* src_pool, void* dst_pool, const BlockPoolShape& src_shape,
                                   const BlockPoolShape& dst_shape, const int32_t* block_pairs, int64_t num_pairs,
                                   cudaStream_t stream) {
  if (!ValidShapes(src_shape, dst_shape, num_pairs)) return cudaErrorInvalidValue;
  const int64_t src_blocks = src_shape.layer_bytes / src_shape.block_bytes;
  const int64_t dst_blocks = dst_shape.layer_bytes / dst_shape.block_bytes;
  for (int64_t p = 0; p < num_pairs; ++p) {
    const int32_t src = block_pairs[2 * p];
    const int32_t dst = block_pairs[2 * p + 1];
    if (src < 0 || src >= src_blocks || dst < 0 || dst >= dst_blocks) return cudaErrorInvalidValue;
  }
  const auto* src_base = static_cast<const char*>(src_pool);
  auto* dst_base = static_cast<char*>(dst_pool);
  const auto bytes = static_cast<size_t>(src_shape.block_bytes);
  for (int64_t layer = 0; layer < src_shape.num_layers; ++layer) {
    for (int64_t p = 0; p < num_pairs; ++p) {
      const char* from = src_base + layer * src_shape.layer_bytes + block_pairs[2 * p] * src_shape.block_bytes;
      char* to = dst_base + layer * dst_shape.layer_bytes + block_pairs[2 * p + 1] * dst_shape.block_bytes;
      const cudaError_t err = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

}  // namespace kvmesh::kernels
