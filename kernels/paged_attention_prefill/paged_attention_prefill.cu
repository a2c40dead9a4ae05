#include "paged_attention_prefill/paged_attention_prefill.h"

#include <climits>
#include <cstdint>

#include "paged_attention_prefill/paged_attention_prefill_kernel.cuh"

namespace kvmesh::kernels {
namespace {

using Launcher = cudaError_t (*)(const PagedAttentionPrefillArgs&, cudaStream_t);

template <typename T, int kHeadDim, int kMTiles>
cudaError_t LaunchTyped(const PagedAttentionPrefillArgs& args, cudaStream_t stream) {
  using Geo = prefill::TileGeometry<kHeadDim, kMTiles>;
  const auto kernel = prefill::PagedAttentionPrefillKernel<T, kHeadDim, kMTiles>;
  // Over 48 KB of dynamic shared memory (head_dim 128) needs the opt-in; cheap to repeat.
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Geo::kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const int32_t tiles_per_seq = (args.max_query_len + Geo::kRows - 1) / Geo::kRows;
  const int64_t blocks = int64_t{tiles_per_seq} * args.num_seqs * args.num_heads;
  kernel<<<static_cast<unsigned>(blocks), prefill::kThreads, Geo::kSmemBytes, stream>>>(args, tiles_per_seq);
  return cudaGetLastError();
}

// [kv_dtype][head_dim 64, 128][rows per warp 16, 32]
constexpr Launcher kLaunchers[3][2][2] = {
    {{LaunchTyped<float, 64, 1>, LaunchTyped<float, 64, 2>}, {LaunchTyped<float, 128, 1>, LaunchTyped<float, 128, 2>}},
    {{LaunchTyped<uint16_t, 64, 1>, LaunchTyped<uint16_t, 64, 2>},
     {LaunchTyped<uint16_t, 128, 1>, LaunchTyped<uint16_t, 128, 2>}},
    {{LaunchTyped<uint8_t, 64, 1>, LaunchTyped<uint8_t, 64, 2>},
     {LaunchTyped<uint8_t, 128, 1>, LaunchTyped<uint8_t, 128, 2>}},
};

bool ValidShapes(const PagedAttentionPrefillArgs& a) {
  if (a.q == nullptr || a.kv_cache == nullptr || a.query_start == nullptr || a.context_lens == nullptr ||
      a.block_tables == nullptr || a.out == nullptr) {
    return false;
  }
  if (a.num_seqs <= 0 || a.num_tokens <= 0 || a.num_heads <= 0 || a.num_kv_heads <= 0 || a.block_size_tokens <= 0 ||
      a.max_blocks_per_seq <= 0 || a.max_query_len <= 0) {
    return false;
  }
  if (a.num_heads % a.num_kv_heads != 0 || (a.head_dim != 64 && a.head_dim != 128)) return false;
  if (a.block_size_tokens % prefill::kChunk != 0) return false;
  const int32_t dtype = static_cast<int32_t>(a.kv_dtype);
  if (dtype < 0 || dtype > 2) return false;
  if (a.kv_dtype == KvCacheDType::kFp8E4M3 && (a.k_scale == nullptr || a.v_scale == nullptr)) return false;
  // 16-byte copies from the pool (cp.async, float4) and of q (float4, 32-row kernel); out as float2.
  const auto misaligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes != 0; };
  if (misaligned(a.kv_cache, 16) || misaligned(a.q, 16) || misaligned(a.out, 8)) return false;
  // The grid of the smaller CTA (64 rows), the larger of the two.
  const int64_t tiles_per_seq = (int64_t{a.max_query_len} + 63) / 64;
  return tiles_per_seq * a.num_seqs * a.num_heads <= INT_MAX;
}

}  // namespace

cudaError_t LaunchPagedAttentionPrefillWithRowsPerWarp(const PagedAttentionPrefillArgs& args, int32_t rows_per_warp,
                                                      cudaStream_t stream) {
  if (!ValidShapes(args) || (rows_per_warp != 16 && rows_per_warp != 32)) return cudaErrorInvalidValue;
  return kLaunchers[static_cast<int32_t>(args.kv_dtype)][args.head_dim == 128 ? 1 : 0][rows_per_warp / 16 - 1](
      args, stream);
}

cudaError_t LaunchPagedAttentionPrefill(const PagedAttentionPrefillArgs& args, cudaStream_t stream) {
  return LaunchPagedAttentionPrefillWithRowsPerWarp(args, kPagedAttentionPrefillRowsPerWarp, stream);
}

}  // namespace kvmesh::kernels
