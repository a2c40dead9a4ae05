// What LaunchPagedAttentionDecode launches, worked out on the host: the argument checks,
// the kernel variant, the grids and the workspace layout. One header that both the
// launcher (paged_attention_decode.cu) and the host emulation (host_emulation/) read, so
// the emulated test runs the launcher's own derivation, not a copy of it. Host-only
// arithmetic; no launch (`<<<>>>`) here, so the host compiler can read it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "paged_attention_decode/paged_attention_decode.h"
#include "paged_attention_decode/paged_attention_decode_kernel.cuh"

namespace kvmesh::kernels::paged_attention_decode {

static_assert(kPartitionTokens == kPagedAttentionDecodePartitionTokens, "");

inline constexpr int kMaxGridYZ = 65535;
// Query heads per CTA: the group rounded up to 1, 2, 4 or 8 (larger groups take several CTAs).
inline constexpr int kGroupTiles[] = {1, 2, 4, 8};
inline constexpr int kNumGroupTiles = 4;

inline int GroupTileIndex(int group) {
  for (int i = 0; i < kNumGroupTiles; ++i) {
    if (group <= kGroupTiles[i]) return i;
  }
  return kNumGroupTiles - 1;
}

inline bool IsPowerOfTwo(int32_t x) { return x > 0 && (x & (x - 1)) == 0; }

inline int32_t Log2(int32_t x) {
  int32_t log = 0;
  while ((int32_t{1} << log) < x) ++log;
  return log;
}

inline int64_t NumPartitions(const PagedAttentionDecodeArgs& args) {
  return (int64_t{args.max_context_len} + kPartitionTokens - 1) / kPartitionTokens;
}

// The split path's scratch: partial outputs, maxima and sums, all f32 (0: no split).
inline size_t WorkspaceBytes(const PagedAttentionDecodeArgs& args) {
  if (args.num_seqs <= 0 || args.num_heads <= 0 || args.head_dim <= 0 || args.max_context_len <= 0) return 0;
  const int64_t partitions = NumPartitions(args);
  if (partitions <= 1) return 0;
  return static_cast<size_t>(int64_t{args.num_seqs} * args.num_heads * partitions * (args.head_dim + 2)) *
         sizeof(float);
}

inline bool ShapesValid(const PagedAttentionDecodeArgs& args) {
  if (args.num_seqs <= 0 || args.num_heads <= 0 || args.num_kv_heads <= 0 || args.head_dim <= 0 ||
      args.block_size_tokens <= 0 || args.max_blocks_per_seq <= 0 || args.max_context_len <= 0) {
    return false;
  }
  if (args.num_heads % args.num_kv_heads != 0) return false;
  if (args.head_dim != 64 && args.head_dim != 128) return false;
  if (!IsPowerOfTwo(args.block_size_tokens) || args.block_size_tokens < kMinBlockSizeTokens ||
      args.block_size_tokens > kPartitionTokens) {
    return false;
  }
  if (args.num_seqs > kMaxGridYZ || NumPartitions(args) > kMaxGridYZ) return false;
  return args.kv_dtype == KvCacheDType::kF32 || args.kv_dtype == KvCacheDType::kBf16 ||
         args.kv_dtype == KvCacheDType::kFp8E4M3;
}

struct LaunchPlan {
  PartitionParams partition{};
  ReduceParams reduce{};  // used only when num_partitions > 1
  dim3 partition_grid, reduce_grid;
  unsigned reduce_threads = 0;
  int group_tile_index = 0;  // the kernel table's column: kGroupTiles[i] query heads per CTA
  int32_t num_partitions = 0;
};

// Checks `args` as LaunchPagedAttentionDecode documents (cudaErrorInvalidValue otherwise)
// and fills *plan.
inline cudaError_t PlanLaunch(const PagedAttentionDecodeArgs& args, void* workspace, size_t workspace_bytes,
                              LaunchPlan* plan) {
  if (!ShapesValid(args)) return cudaErrorInvalidValue;
  const bool fp8 = args.kv_dtype == KvCacheDType::kFp8E4M3;
  if (args.q == nullptr || args.kv_cache == nullptr || args.context_lens == nullptr || args.block_tables == nullptr ||
      args.out == nullptr || (fp8 && (args.k_scale == nullptr || args.v_scale == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(args.kv_cache) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t partitions = NumPartitions(args);
  const size_t needed = WorkspaceBytes(args);
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
  plan->partition = PartitionParams{
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
      .q_multiplier = args.scale * kLog2e,
  };
  plan->reduce = ReduceParams{
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
  plan->partition_grid = dim3(static_cast<unsigned>(args.num_kv_heads * head_tiles),
                              static_cast<unsigned>(args.num_seqs), static_cast<unsigned>(partitions));
  plan->reduce_grid = dim3(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs));
  plan->reduce_threads = static_cast<unsigned>(args.head_dim);
  plan->group_tile_index = tile_index;
  plan->num_partitions = static_cast<int32_t>(partitions);
  return cudaSuccess;
}

}  // namespace kvmesh::kernels::paged_attention_decode
