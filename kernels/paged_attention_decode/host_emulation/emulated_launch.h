// Host emulation (see prelude.h): LaunchPagedAttentionDecode's one or two launches run on the
// host by host_emulation/grid.h, CTA by CTA, each as one std::thread per CUDA thread
// executing the kernels' own code. Slow: small shapes only. The checks, parameters, grids and workspace layout are the
// launcher's own (launch_plan.h); only the launches differ. The split path's workspace is
// its own, and starts as NaN, so a partition the reduce reads but no CTA wrote shows.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "host_emulation/grid.h"
#include "paged_attention_decode/paged_attention_decode.h"
#include "paged_attention_decode/launch_plan.h"
#include "paged_attention_decode/paged_attention_decode_kernel.cuh"

namespace kvmesh::kernels::host_emulation {

template <typename T, int kHeadDim, int kGroupTile>
void EmulatePartitionGrid(dim3 grid, const paged_attention_decode::PartitionParams& params) {
  EmulateGrid(grid, paged_attention_decode::kThreads,
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
    EmulateGrid(plan.reduce_grid, plan.reduce_threads, [&reduce] { pad::ReduceKernel<128>(reduce); });
  } else {
    EmulateGrid(plan.reduce_grid, plan.reduce_threads, [&reduce] { pad::ReduceKernel<64>(reduce); });
  }
  return cudaSuccess;
}

}  // namespace kvmesh::kernels::host_emulation
