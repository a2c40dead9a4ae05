#include "copy_blocks/copy_blocks.h"

#include "copy_blocks/copy_blocks_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchCopyBlocks(void* pool, const BlockPoolShape& shape, const int32_t* block_pairs, int64_t num_pairs,
                             cudaStream_t stream) {
  if (shape.num_layers <= 0 || shape.layer_bytes <= 0 || shape.block_bytes <= 0 || num_pairs < 0 ||
      shape.num_layers > 65535) {
    return cudaErrorInvalidValue;
  }
  if (num_pairs == 0) return cudaSuccess;
  const dim3 grid = copy_blocks::CopyBlocksGrid(num_pairs, shape);
  char* base = static_cast<char*>(pool);
  if (copy_blocks::CopiesInUint4(pool, shape)) {
    copy_blocks::CopyBlocksKernel<uint4><<<grid, copy_blocks::kThreads, 0, stream>>>(base, shape, block_pairs);
  } else {
    copy_blocks::CopyBlocksKernel<unsigned char><<<grid, copy_blocks::kThreads, 0, stream>>>(base, shape, block_pairs);
  }
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
