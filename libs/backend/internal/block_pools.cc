#include "backend/internal/block_pools.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvmesh::backend::internal {
namespace {

// Clause 1 of CheckBlockCopy.
absl::Status CheckBlockPools(const Backend::BlockPool& src, const Backend::BlockPool& dst) {
  for (const Backend::BlockPool* pool : {&src, &dst}) {
    const char* side = pool == &src ? "source" : "destination";
    if (pool->data == nullptr || pool->num_layers < 1 || pool->block_bytes < 1 ||
        pool->layer_bytes < pool->block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the ", side, " pool is not a pool of whole blocks: ",
                                                     pool->num_layers, " layers of ", pool->layer_bytes,
                                                     " bytes, blocks of ", pool->block_bytes));
    }
  }
  if (src.num_layers != dst.num_layers || src.block_bytes != dst.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pools of ", src.num_layers, " layers of ", src.block_bytes,
                                                   "-byte blocks and of ", dst.num_layers, " layers of ",
                                                   dst.block_bytes, "-byte blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBlockCopy(const Backend::BlockPool& src, const Backend::BlockPool& dst,
                            std::span<const int32_t> pairs) {
  if (absl::Status pools = CheckBlockPools(src, dst); !pools.ok()) return pools;
  if (pairs.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(pairs.size(), " block ids are not (src, dst) pairs"));
  }
  const int64_t src_blocks = src.layer_bytes / src.block_bytes;
  const int64_t dst_blocks = dst.layer_bytes / dst.block_bytes;
  // Sorted ids, so that the cost follows the pairs, not the pools' sizes.
  std::vector<int32_t> written;  // every dst
  std::vector<int32_t> moved;    // within one pool: every src of a pair that moves a block
  const bool one_pool = src.data == dst.data;
  written.reserve(pairs.size() / 2);
  for (size_t i = 0; i < pairs.size(); i += 2) {
    const int32_t from = pairs[i];
    const int32_t to = pairs[i + 1];
    if (from < 0 || from >= src_blocks || to < 0 || to >= dst_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block pair ", i / 2, " (", from, ", ", to,
                                                     ") is outside pools of ", src_blocks, " and ", dst_blocks,
                                                     " blocks"));
    }
    written.push_back(to);
    if (one_pool && from != to) moved.push_back(from);
  }
  std::sort(written.begin(), written.end());
  if (auto twice = std::adjacent_find(written.begin(), written.end()); twice != written.end()) {
    return absl::InvalidArgumentError(absl::StrCat("block ", *twice, " is the destination of two pairs"));
  }
  std::sort(moved.begin(), moved.end());
  for (size_t i = 0; i < pairs.size() && !moved.empty(); i += 2) {
    if (pairs[i] != pairs[i + 1] && std::binary_search(moved.begin(), moved.end(), pairs[i + 1])) {
      return absl::InvalidArgumentError(absl::StrCat("block ", pairs[i + 1], " is both copied onto and copied from"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::backend::internal
