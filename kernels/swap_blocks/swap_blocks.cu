#include "swap_blocks/swap_blocks.h"

#include "swap_blocks/swap_blocks_kernel.cuh"

namespace kvmesh::kernels {
namespace {

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
  const dim3 grid = swap_blocks::SwapBlocksGrid(num_pairs, src_shape);
  const auto* src = static_cast<const char*>(src_pool);
  auto* dst = static_cast<char*>(dst_pool);
  const int64_t src_blocks = src_shape.layer_bytes / src_shape.block_bytes;
  const int64_t dst_blocks = dst_shape.layer_bytes / dst_shape.block_bytes;
  if (swap_blocks::SwapsInUint4(src_pool, dst_pool, src_shape, dst_shape)) {
    swap_blocks::SwapBlocksKernel<uint4><<<grid, swap_blocks::kThreads, 0, stream>>>(
        src, dst, src_shape.layer_bytes, dst_shape.layer_bytes, src_shape.block_bytes, src_blocks, dst_blocks,
        block_pairs);
  } else {
    swap_blocks::SwapBlocksKernel<unsigned char><<<grid, swap_blocks::kThreads, 0, stream>>>(
        src, dst, src_shape.layer_bytes, dst_shape.layer_bytes, src_shape.block_bytes, src_blocks, dst_blocks,
        block_pairs);
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
