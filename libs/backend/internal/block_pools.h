// Checks of the whole-block ops' arguments (ops.h CopyBlocks and SwapBlocks), shared by
// the backends that can read them on the host (cpu stops on a failed one; cuda records
// it), so that they accept and refuse exactly the same pools and pairs.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "backend/ops.h"

namespace kvmesh::backend::internal {

// OK when CopyBlocks (`src` and `dst` the same pool) or SwapBlocks can copy `pairs`:
//  1. the pools have the same num_layers (>= 1) and block_bytes (>= 1), each layer_bytes
//     >= block_bytes, and data;
//  2. `pairs` is [n, 2] (src, dst) ids, each src in [0, src.layer_bytes / block_bytes)
//     and each dst likewise in `dst`;
//  3. no dst is in two pairs and, within one pool (the same data), no dst is also the src
//     of another pair, so that the pairs may run in any order, or at once. A pair (b, b)
//     within one pool is a no-op and allowed.
// InvalidArgument naming the first clause broken (and the pair) otherwise.
absl::Status CheckBlockCopy(const Backend::BlockPool& src, const Backend::BlockPool& dst,
                            std::span<const int32_t> pairs);

}  // namespace kvmesh::backend::internal
