// Moves whole KV blocks between a device pool and a pinned host pool (the offload tier of
// docs/architecture.md §3: a block evicted from device memory is written to pinned host
// memory, and onboarded again later). Both pools are layer-major as kv::KvLayout lays
// them out ([num_layers][num_blocks][block bytes]) and may hold different numbers of
// blocks: block `src` of every layer of the source pool is copied byte for byte onto
// block `dst` of the same layer of the destination pool, for each (src, dst) pair.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
//
// Memory spaces: one pool is device memory, the other pinned host memory from
// cudaHostAlloc (or cudaHostRegister with cudaHostRegisterMapped), passed as its device
// pointer (under UVA, on every 64-bit platform CUDA supports, that is the host pointer
// itself). Either direction: device -> host (offload) or host -> device (onboard).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "copy_blocks/copy_blocks.h"

namespace kvmesh::kernels {

// One kernel launch for all pairs and all layers: each CTA copies one block of one layer
// with 16-byte loads and stores (several in flight per thread), the pinned side read or
// written by the GPU directly over PCIe / NVLink-C2C (zero-copy). Falls back to 1-byte
// accesses when a pool pointer, block_bytes or a layer_bytes is not a multiple of 16.
//   src_pool, dst_pool: src_shape.num_layers * src_shape.layer_bytes and
//                       dst_shape.num_layers * dst_shape.layer_bytes bytes
//   src_shape, dst_shape: same num_layers and block_bytes; layer_bytes may differ
//                       (a different number of blocks per side)
//   block_pairs: [num_pairs, 2] int32 (src id, dst id), device memory or mapped pinned
//                host memory; src id in [0, src layer_bytes / block_bytes), dst id likewise
//                for the destination. A dst id may appear in one pair at most. A pair with
//                an id out of range is skipped (the device cannot report it): callers
//                validate ids, as LaunchSwapBlocksMemcpy does.
// cudaErrorInvalidValue for non-positive sizes, num_layers that differ or exceed 65535,
// block_bytes that differ or exceed a layer_bytes, num_pairs < 0 or > 2^31 - 1; errors of
// the launch otherwise. Asynchronous on `stream`: the pinned side must stay allocated,
// and unread by the host, until the stream reaches this point.
cudaError_t LaunchSwapBlocks(const void* src_pool, void* dst_pool, const BlockPoolShape& src_shape,
                             const BlockPoolShape& dst_shape, const int32_t* block_pairs, int64_t num_pairs,
                             cudaStream_t stream);

// The same copies as one cudaMemcpyAsync (cudaMemcpyDefault) per (layer, pair), vLLM's
// swap_blocks: the baseline tests/bench/swap_blocks_cuda_bench.cc measures the kernel
// against. Here block_pairs is HOST memory, and every id is checked before any copy is
// issued (cudaErrorInvalidValue for an id out of range, nothing copied). Returns the
// first failing cudaMemcpyAsync's error (earlier copies stay issued).
cudaError_t LaunchSwapBlocksMemcpy(const void* src_pool, void* dst_pool, const BlockPoolShape& src_shape,
                                   const BlockPoolShape& dst_shape, const int32_t* block_pairs, int64_t num_pairs,
                                   cudaStream_t stream);

}  // namespace kvmesh::kernels
