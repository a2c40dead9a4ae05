// Host emulation (see prelude.h): LaunchPagedAttentionDecode's one or two launches run on the
// host, CTA by CTA, each as one std::thread per CUDA thread executing the kernels' own code.
// Slow: small shapes only. The checks, parameters, grids and workspace layout are the
// launcher's own (launch_plan.h); only the launches differ. The split path's workspace is
// its own, and starts as NaN, so a partition the reduce reads but no CTA wrote shows.
#pragma once

#include <barrier>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "paged_attention_decode/paged_attention_decode.h"
#include "paged_attention_decode/launch_plan.h"
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
  if ((args.head_dim != 64 && args.head_dim != 128) || dtype < 0 || dtype > 2) return cudaErrorInvalidValue;
  // The launcher's own plan (launch_plan.h), over a workspace of our own that starts as NaN.
  std::vector<float> workspace(pad::WorkspaceBytes(args) / sizeof(float), std::numeric_limits<float>::quiet_NaN());
  pad::LaunchPlan plan;
  if (const cudaError_t err =
          pad::PlanLaunch(args, workspace.empty() ? nullptr : workspace.data(), workspace.size() * sizeof(float), &plan);
      err != cudaSuccess) {
    return err;
  }
  kPartitionEmulators[dtype][args.head_dim == 128 ? 1 : 0][plan.group_tile_index](plan.partition_grid, plan.partition);
  if (plan.num_partitions == 1) return cudaSuccess;
  const pad::ReduceParams& reduce = plan.reduce;
  if (args.head_dim == 128) {
    EmulateDecodeGrid(plan.reduce_grid, plan.reduce_threads, [&reduce] { pad::ReduceKernel<128>(reduce); });
  } else {
    EmulateDecodeGrid(plan.reduce_grid, plan.reduce_threads, [&reduce] { pad::ReduceKernel<64>(reduce); });
  }
  return cudaSuccess;
}

}  // namespace kvmesh::kernels::host_emulation
