// Argument checks, the kernel table (element type x head_dim x query heads per CTA) and
// the one or two launches of paged-attention decode (paged_attention_decode.h).
#include "paged_attention_decode/paged_attention_decode.h"

#include <cstdint>

#include "paged_attention_decode/paged_attention_decode_kernel.cuh"

namespace kvmesh::kernels {
namespace {

namespace pad = paged_attention_decode;

static_assert(pad::kPartitionTokens == kPagedAttentionDecodePartitionTokens, "");

constexpr int kMaxGridYZ = 65535;

using PartitionKernelFn = void (*)(pad::PartitionParams);
using ReduceKernelFn = void (*)(pad::ReduceParams);

// Query heads per CTA: the group rounded up to 1, 2, 4 or 8 (larger groups take several CTAs).
constexpr int kGroupTiles[] = {1, 2, 4, 8};
constexpr int kNumGroupTiles = 4;

int GroupTileIndex(int group) {
  for (int i = 0; i < kNumGroupTiles; ++i) {
    if (group <= kGroupTiles[i]) return i;
  }
  return kNumGroupTiles - 1;
}

template <typename T, int kHeadDim>
struct PartitionKernelRow {
  static constexpr PartitionKernelFn kByGroupTile[kNumGroupTiles] = {
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

bool IsPowerOfTwo(int32_t x) { return x > 0 && (x & (x - 1)) == 0; }

int32_t Log2(int32_t x) {
  int32_t log = 0;
  while ((int32_t{1} << log) < x) ++log;
  return log;
}

int64_t NumPartitions(const PagedAttentionDecodeArgs& args) {
  return (int64_t{args.max_context_len} + pad::kPartitionTokens - 1) / pad::kPartitionTokens;
}

bool ShapesValid(const PagedAttentionDecodeArgs& args) {
  if (args.num_seqs <= 0 || args.num_heads <= 0 || args.num_kv_heads <= 0 || args.head_dim <= 0 ||
      args.block_size_tokens <= 0 || args.max_blocks_per_seq <= 0 || args.max_context_len <= 0) {
    return false;
  }
  if (args.num_heads % args.num_kv_heads != 0) return false;
  if (args.head_dim != 64 && args.head_dim != 128) return false;
  if (!IsPowerOfTwo(args.block_size_tokens) || args.block_size_tokens < pad::kMinBlockSizeTokens ||
      args.block_size_tokens > pad::kPartitionTokens) {
    return false;
  }
  if (args.num_seqs > kMaxGridYZ || NumPartitions(args) > kMaxGridYZ) return false;
  return args.kv_dtype == KvCacheDType::kF32 || args.kv_dtype == KvCacheDType::kBf16 ||
         args.kv_dtype == KvCacheDType::kFp8E4M3;
}

}  // namespace

size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionDecodeArgs& args) {
  if (args.num_seqs <= 0 || args.num_heads <= 0 || args.head_dim <= 0 || args.max_context_len <= 0) return 0;
  const int64_t partitions = NumPartitions(args);
  if (partitions <= 1) return 0;
  return static_cast<size_t>(int64_t{args.num_seqs} * args.num_heads * partitions * (args.head_dim + 2)) *
         sizeof(float);
}

cudaError_t LaunchPagedAttentionDecode(const PagedAttentionDecodeArgs& args, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  if (!ShapesValid(args)) return cudaErrorInvalidValue;
  const bool fp8 = args.kv_dtype == KvCacheDType::kFp8E4M3;
  if (args.q == nullptr || args.kv_cache == nullptr || args.context_lens == nullptr || args.block_tables == nullptr ||
      args.out == nullptr || (fp8 && (args.k_scale == nullptr || args.v_scale == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(args.kv_cache) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t partitions = NumPartitions(args);
  const size_t needed = PagedAttentionDecodeWorkspaceBytes(args);
  if (needed > 0 && (workspace == nullptr || workspace_bytes < needed ||
                     reinterpret_cast<uintptr_t>(workspace) % alignof(float) != 0)) {
    return cudaErrorInvalidValue;
  }

  const int group = args.num_heads / args.num_kv_heads;
  const int tile_index = GroupTileIndex(group);
  const int tile = kGroupTiles[tile_index];
  const int head_tiles = (group + tile - 1) / tile;
  // Workspace: partial outputs, then maxima, then sums (all f32).
  const int64_t rows = int64_t{args.num_seqs} * args.num_heads * partitions;
  float* partial_out = needed > 0 ? static_cast<float*>(workspace) : nullptr;
  float* partial_max = needed > 0 ? partial_out + rows * args.head_dim : nullptr;
  float* partial_sum = needed > 0 ? partial_max + rows : nullptr;

  const pad::PartitionParams params = {
      .q = args.q,
      .kv_cache = args.kv_cache,
      .context_lens = args.context_lens,
      .block_tables = args.block_tables,
      .k_scale = fp8 ? args.k_scale : nullptr,
      .v_scale = fp8 ? args.v_scale : nullptr,
      .out = args.out,
      .partial_out = partial_out,
      .partial_max = partial_max,
      .partial_sum = partial_sum,
      .num_heads = args.num_heads,
      .num_kv_heads = args.num_kv_heads,
      .group = group,
      .head_tiles = head_tiles,
      .block_size_tokens = args.block_size_tokens,
      .log2_block_size = Log2(args.block_size_tokens),
      .max_blocks_per_seq = args.max_blocks_per_seq,
      .max_context_len = args.max_context_len,
      .num_partitions = static_cast<int32_t>(partitions),
      .q_multiplier = args.scale * pad::kLog2e,
  };
  const dim3 grid(static_cast<unsigned>(args.num_kv_heads * head_tiles), static_cast<unsigned>(args.num_seqs),
                  static_cast<unsigned>(partitions));
  PartitionKernels(args.kv_dtype, args.head_dim)[tile_index]<<<grid, pad::kThreads, 0, stream>>>(params);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || partitions == 1) return err;

  const pad::ReduceParams reduce = {
      .context_lens = args.context_lens,
      .partial_out = partial_out,
      .partial_max = partial_max,
      .partial_sum = partial_sum,
      .out = args.out,
      .num_heads = args.num_heads,
      .block_size_tokens = args.block_size_tokens,
      .max_blocks_per_seq = args.max_blocks_per_seq,
      .max_context_len = args.max_context_len,
      .num_partitions = static_cast<int32_t>(partitions),
  };
  const ReduceKernelFn reduce_kernel = args.head_dim == 128 ? &pad::ReduceKernel<128> : &pad::ReduceKernel<64>;
  reduce_kernel<<<dim3(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs)),
                  static_cast<unsigned>(args.head_dim), 0, stream>>>(reduce);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
