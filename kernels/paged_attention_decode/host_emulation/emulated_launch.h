// Host emulation (see prelude.h): LaunchPagedAttentionDecode's one or two launches run on the
// host, CTA by CTA, each as one std::thread per CUDA thread executing the kernels' own code.
// Slow: small shapes only. Takes valid shapes (the launcher's checks are not repeated):
// cudaErrorInvalidValue only for what it has no instance for (head_dim, pool type, a block
// size that is not a power of two). The split path's workspace is its own, and starts as
// NaN, so a partition the reduce reads but no CTA wrote shows in the output.
//
// NOTE: the parameters, grids and workspace layout below repeat LaunchPagedAttentionDecode's
// (paged_attention_decode.cu, which a host compiler cannot read: it launches with <<<>>>).
// Keep the two in step; the launcher's own derivation is what this emulation does not test.
#pragma once

#include <barrier>
#include <bit>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "paged_attention_decode/paged_attention_decode.h"
#include "paged_attention_decode/paged_attention_decode_kernel.cuh"

namespace kvmesh::kernels::host_emulation {

// Runs `kernel` (a callable that executes one CUDA thread's code) for every CTA of `grid`,
// x fastest, one CTA at a time.
template <typename Kernel>
void EmulateDecodeGrid(dim3 grid, unsigned threads_per_cta, const Kernel& kernel) {
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> barrier(threads_per_cta);
        std::vector<Warp> warps(threads_per_cta / kWarpSize);
        cta = Cta{.block_idx = uint3{x, y, z}, .barrier = &barrier, .warps = warps.data()};
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < threads_per_cta; ++t) {
          threads.emplace_back([&kernel, t] {
            thread_idx = uint3{t, 0, 0};
            kernel();
          });
        }
        for (std::thread& th : threads) th.join();
      }
    }
  }
}

template <typename T, int kHeadDim, int kGroupTile>
void EmulatePartitionGrid(dim3 grid, const paged_attention_decode::PartitionParams& params) {
  EmulateDecodeGrid(grid, paged_attention_decode::kThreads,
                    [&params] { paged_attention_decode::PartitionKernel<T, kHeadDim, kGroupTile>(params); });
}

inline cudaError_t EmulatePagedAttentionDecode(const PagedAttentionDecodeArgs& args) {
  namespace pad = paged_attention_decode;
  using PartitionEmulator = void (*)(dim3, const pad::PartitionParams&);
  // [kv_dtype][head_dim 64, 128][query heads per CTA 1, 2, 4, 8], as the launcher's table.
  constexpr PartitionEmulator kPartitionEmulators[3][2][4] = {
      {{EmulatePartitionGrid<float, 64, 1>, EmulatePartitionGrid<float, 64, 2>, EmulatePartitionGrid<float, 64, 4>,
        EmulatePartitionGrid<float, 64, 8>},
       {EmulatePartitionGrid<float, 128, 1>, EmulatePartitionGrid<float, 128, 2>,
        EmulatePartitionGrid<float, 128, 4>, EmulatePartitionGrid<float, 128, 8>}},
      {{EmulatePartitionGrid<uint16_t, 64, 1>, EmulatePartitionGrid<uint16_t, 64, 2>,
        EmulatePartitionGrid<uint16_t, 64, 4>, EmulatePartitionGrid<uint16_t, 64, 8>},
       {EmulatePartitionGrid<uint16_t, 128, 1>, EmulatePartitionGrid<uint16_t, 128, 2>,
        EmulatePartitionGrid<uint16_t, 128, 4>, EmulatePartitionGrid<uint16_t, 128, 8>}},
      {{EmulatePartitionGrid<uint8_t, 64, 1>, EmulatePartitionGrid<uint8_t, 64, 2>,
        EmulatePartitionGrid<uint8_t, 64, 4>, EmulatePartitionGrid<uint8_t, 64, 8>},
       {EmulatePartitionGrid<uint8_t, 128, 1>, EmulatePartitionGrid<uint8_t, 128, 2>,
        EmulatePartitionGrid<uint8_t, 128, 4>, EmulatePartitionGrid<uint8_t, 128, 8>}}};
  const int32_t dtype = static_cast<int32_t>(args.kv_dtype);
  if ((args.head_dim != 64 && args.head_dim != 128) || dtype < 0 || dtype > 2 ||
      !std::has_single_bit(static_cast<uint32_t>(args.block_size_tokens))) {
    return cudaErrorInvalidValue;
  }
  const int32_t group = args.num_heads / args.num_kv_heads;
  const int tile_index = group <= 1 ? 0 : group <= 2 ? 1 : group <= 4 ? 2 : 3;
  const int32_t head_tiles = (group + (1 << tile_index) - 1) >> tile_index;
  const int32_t partitions = (args.max_context_len + pad::kPartitionTokens - 1) / pad::kPartitionTokens;
  const bool fp8 = args.kv_dtype == KvCacheDType::kFp8E4M3;
  // Workspace as the launcher lays it out: partial outputs, then maxima, then sums.
  const int64_t rows = int64_t{args.num_seqs} * args.num_heads * partitions;
  std::vector<float> workspace(partitions > 1 ? static_cast<size_t>(rows * (args.head_dim + 2)) : 0,
                               std::numeric_limits<float>::quiet_NaN());
  float* partial_out = partitions > 1 ? workspace.data() : nullptr;
  float* partial_max = partitions > 1 ? partial_out + rows * args.head_dim : nullptr;
  float* partial_sum = partitions > 1 ? partial_max + rows : nullptr;
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
      .log2_block_size = std::countr_zero(static_cast<uint32_t>(args.block_size_tokens)),
      .max_blocks_per_seq = args.max_blocks_per_seq,
      .max_context_len = args.max_context_len,
      .num_partitions = partitions,
      .q_multiplier = args.scale * pad::kLog2e,
  };
  const dim3 grid(static_cast<unsigned>(args.num_kv_heads * head_tiles), static_cast<unsigned>(args.num_seqs),
                  static_cast<unsigned>(partitions));
  kPartitionEmulators[dtype][args.head_dim == 128 ? 1 : 0][tile_index](grid, params);
  if (partitions == 1) return cudaSuccess;

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
      .num_partitions = partitions,
  };
  const dim3 reduce_grid(static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs));
  const auto reduce_threads = static_cast<unsigned>(args.head_dim);
  if (args.head_dim == 128) {
    EmulateDecodeGrid(reduce_grid, reduce_threads, [&reduce] { pad::ReduceKernel<128>(reduce); });
  } else {
    EmulateDecodeGrid(reduce_grid, reduce_threads, [&reduce] { pad::ReduceKernel<64>(reduce); });
  }
  return cudaSuccess;
}

}  // namespace kvmesh::kernels::host_emulation
