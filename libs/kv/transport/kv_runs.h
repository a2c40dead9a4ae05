// KvRun: a stretch of blocks that is contiguous in both the source and the destination
// pool, so that one layer of it moves as ONE put (kv/kv_layout.h: consecutive block ids
// of a layer are consecutive bytes). Merging runs is what keeps a transfer's descriptor
// count at layers x runs instead of layers x blocks (vLLM #34054 posted 40k descriptors
// for 313 MB).
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_types.h"

namespace kvmesh::kv {

struct KvRun {
  int32_t first_index = 0;  // index into the block lists passed to MergeKvRuns
  BlockId src_first;        // source pool block id of the run's first block
  BlockId dst_first;        // destination pool block id of the run's first block
  int32_t num_blocks = 0;

  bool operator==(const KvRun&) const = default;
};

// Splits the pairs (src[i], dst[i]) into maximal runs where both ids grow by one per
// step. `src` and `dst` must have the same length (the shorter one bounds it).
inline std::vector<KvRun> MergeKvRuns(std::span<const BlockId> src, std::span<const BlockId> dst) {
  std::vector<KvRun> runs;
  const size_t n = src.size() < dst.size() ? src.size() : dst.size();
  for (size_t i = 0; i < n; ++i) {
    if (!runs.empty()) {
      KvRun& last = runs.back();
      if (src[i].value == last.src_first.value + last.num_blocks &&
          dst[i].value == last.dst_first.value + last.num_blocks) {
        ++last.num_blocks;
        continue;
      }
    }
    runs.push_back(KvRun{.first_index = static_cast<int32_t>(i), .src_first = src[i], .dst_first = dst[i], .num_blocks = 1});
  }
  return runs;
}

}  // namespace kvmesh::kv
