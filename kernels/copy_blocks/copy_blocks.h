// Copies whole KV blocks within a device pool by id (copy-on-write after a fork), with
// the semantics of kv::KvStorage::CopyBlock applied to each (src, dst) pair: block src
// of each layer is copied byte for byte onto block dst of the same layer; src == dst is
// a no-op. Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// Where the blocks live: num_layers layers of layer_bytes each from `pool`, each layer
// holding blocks of block_bytes (kv::KvLayout's LayerBytes() and BlockBytes()). One
// layer's pool is num_layers == 1.
struct BlockPoolShape {
  int64_t num_layers = 0;
  int64_t layer_bytes = 0;
  int64_t block_bytes = 0;
};

// block_pairs: [num_pairs, 2] int32 in device memory, (src, dst) block ids, each in
// [0, layer_bytes / block_bytes). A block may be the dst of one pair at most, and no
// dst may be the src of another pair (the pairs run in parallel, in no order).
// Copies 16 bytes at a time when pool and block_bytes allow, else 1.
// cudaErrorInvalidValue for a non-positive size or num_layers.
cudaError_t LaunchCopyBlocks(void* pool, const BlockPoolShape& shape, const int32_t* block_pairs, int64_t num_pairs,
                             cudaStream_t stream);

}  // namespace kvmesh::kernels
