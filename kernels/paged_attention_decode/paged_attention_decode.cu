// The kernel table (element type x head_dim x query heads per CTA) and
// the one or two launches of paged-attention decode (paged_attention_decode.h).
#include "paged_attention_decode/paged_attention_decode.h"

#include <cstdint>

#include "paged_attention_decode/launch_plan.h"
#include "paged_attention_decode/paged_attention_decode_kernel.cuh"

namespace kvmesh::kernels {
namespace {

namespace pad = paged_attention_decode;

using PartitionKernelFn = void (*)(pad::PartitionParams);
using ReduceKernelFn = void (*)(pad::ReduceParams);

template <typename T, int kHeadDim>
struct PartitionKernelRow {
  static constexpr PartitionKernelFn kByGroupTile[pad::kNumGroupTiles] = {
      &pad::PartitionKernel<T, kHeadDim, 1>, &pad::PartitionKernel<T, kHeadDim, 2>,
      &pad::PartitionKernel<T, kHeadDim, 4>, &pad::PartitionKernel<T, kHeadDim, 8>};
};

// [dtype][head_dim 64, 128][group tile]
const PartitionKernelFn* PartitionKernels(KvCacheDType dtype, int head_dim) {
  const bool d128 = head_dim == 128;
  switch (dtype) {
    case KvCacheDType::kF32:
      return d128 ? PartitionKernelRow<float, 128>::kByGroupTile : PartitionKernelRow<float, 64>::kByGroupTile;
    case KvCacheDType::kBf16:
      return d128 ? PartitionKernelRow<uint16_t, 128>::kByGroupTile : PartitionKernelRow<uint16_t, 64>::kByGroupTile;
    case KvCacheDType::kFp8E4M3:
      return d128 ? PartitionKernelRow<uint8_t, 128>::kByGroupTile : PartitionKernelRow<uint8_t, 64>::kByGroupTile;
  }
  return nullptr;
}

}  // namespace

size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionDecodeArgs& args) { return pad::WorkspaceBytes(args); }

cudaError_t LaunchPagedAttentionDecode(const PagedAttentionDecodeArgs& args, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  pad::LaunchPlan plan;
  if (const cudaError_t err = pad::PlanLaunch(args, workspace, workspace_bytes, &plan); err != cudaSuccess) return err;
  PartitionKernels(args.kv_dtype, args.head_dim)[plan.group_tile_index]<<<plan.partition_grid, pad::kThreads, 0,
                                                                          stream>>>(plan.partition);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || plan.num_partitions == 1) return err;
  const ReduceKernelFn reduce_kernel = args.head_dim == 128 ? &pad::ReduceKernel<128> : &pad::ReduceKernel<64>;
  reduce_kernel<<<plan.reduce_grid, plan.reduce_threads, 0, stream>>>(plan.reduce);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
