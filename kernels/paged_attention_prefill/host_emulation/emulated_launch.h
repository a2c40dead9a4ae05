// Host emulation (see prelude.h): LaunchPagedAttentionPrefill's grid run on the host by
// host_emulation/grid.h, CTA by CTA, each as kThreads std::threads executing the kernel's
// own code. Slow: small shapes only.
// Takes valid shapes (LaunchPagedAttentionPrefill's checks are not repeated): cudaErrorInvalidValue
// only for a head_dim or pool type it has no instance for.
#pragma once

#include "host_emulation/grid.h"
#include "paged_attention_prefill/paged_attention_prefill.h"
#include "paged_attention_prefill/paged_attention_prefill_kernel.cuh"

// The kernel's `extern __shared__ uint16_t smem[]`, on the host: one CTA's at a time, sized
// for the largest instance. NOTE: defined here, so exactly one translation unit includes this.
namespace kvmesh::kernels::prefill {
alignas(16) uint16_t smem[TileGeometry<128, 2>::kSmemBytes / sizeof(uint16_t)];
}  // namespace kvmesh::kernels::prefill

namespace kvmesh::kernels::host_emulation {

template <typename T, int kHeadDim, int kMTiles>
void EmulatePrefillGrid(const PagedAttentionPrefillArgs& args) {
  using Geo = prefill::TileGeometry<kHeadDim, kMTiles>;
  const int32_t tiles_per_seq = (args.max_query_len + Geo::kRows - 1) / Geo::kRows;
  const int64_t blocks = int64_t{tiles_per_seq} * args.num_seqs * args.num_heads;
  static_assert(Geo::kSmemBytes <= sizeof(prefill::smem));
  EmulateGrid(dim3(static_cast<unsigned>(blocks)), static_cast<unsigned>(prefill::kThreads),
              [&args, tiles_per_seq] { prefill::PagedAttentionPrefillKernel<T, kHeadDim, kMTiles>(args, tiles_per_seq); },
              DynamicShared{.base = reinterpret_cast<unsigned char*>(prefill::smem), .bytes = Geo::kSmemBytes});
}

inline cudaError_t EmulatePagedAttentionPrefill(const PagedAttentionPrefillArgs& args,
                                                int32_t rows_per_warp = kPagedAttentionPrefillRowsPerWarp) {
  using Emulator = void (*)(const PagedAttentionPrefillArgs&);
  // [kv_dtype][head_dim 64, 128][rows per warp 16, 32], as the launcher's table.
  constexpr Emulator kEmulators[3][2][2] = {
      {{EmulatePrefillGrid<float, 64, 1>, EmulatePrefillGrid<float, 64, 2>}, {EmulatePrefillGrid<float, 128, 1>, EmulatePrefillGrid<float, 128, 2>}},
      {{EmulatePrefillGrid<uint16_t, 64, 1>, EmulatePrefillGrid<uint16_t, 64, 2>},
       {EmulatePrefillGrid<uint16_t, 128, 1>, EmulatePrefillGrid<uint16_t, 128, 2>}},
      {{EmulatePrefillGrid<uint8_t, 64, 1>, EmulatePrefillGrid<uint8_t, 64, 2>},
       {EmulatePrefillGrid<uint8_t, 128, 1>, EmulatePrefillGrid<uint8_t, 128, 2>}}};
  const int32_t dtype = static_cast<int32_t>(args.kv_dtype);
  if ((args.head_dim != 64 && args.head_dim != 128) || dtype < 0 || dtype > 2 ||
      (rows_per_warp != 16 && rows_per_warp != 32)) {
    return cudaErrorInvalidValue;
  }
  kEmulators[dtype][args.head_dim == 128 ? 1 : 0][rows_per_warp / 16 - 1](args);
  return cudaSuccess;
}

}  // namespace kvmesh::kernels::host_emulation
