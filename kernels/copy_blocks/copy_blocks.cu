#include "copy_blocks/copy_blocks.h"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

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

}  // namespace

cudaError_t LaunchCopyBlocks(void* pool, const BlockPoolShape& shape, const int32_t* block_pairs, int64_t num_pairs,
                             cudaStream_t stream) {
  if (shape.num_layers <= 0 || shape.layer_bytes <= 0 || shape.block_bytes <= 0 || num_pairs < 0 ||
      shape.num_layers > 65535) {
    return cudaErrorInvalidValue;
  }
  if (num_pairs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(shape.num_layers));
  char* base = static_cast<char*>(pool);
  const bool wide = reinterpret_cast<uintptr_t>(pool) % 16 == 0 && shape.block_bytes % 16 == 0 &&
                    shape.layer_bytes % 16 == 0;
  if (wide) {
    CopyBlocksKernel<uint4><<<grid, kThreads, 0, stream>>>(base, shape, block_pairs);
  } else {
    CopyBlocksKernel<unsigned char><<<grid, kThreads, 0, stream>>>(base, shape, block_pairs);
  }
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
