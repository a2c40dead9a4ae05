#include "engine/block_tables.h"

#include "absl/strings/str_cat.h"

namespace kvmesh::engine {

int32_t BlockTables::TakeRow() {
  int32_t r;
  if (free_rows_.empty()) {
    r = static_cast<int32_t>(rows_.size());
    rows_.emplace_back();
  } else {
    r = free_rows_.back();
    free_rows_.pop_back();
  }
  rows_[static_cast<size_t>(r)].in_use = true;
  rows_[static_cast<size_t>(r)].blocks.clear();
  return r;
}

void BlockTables::FreeRow(int32_t r) {
  rows_[static_cast<size_t>(r)].in_use = false;
  free_rows_.push_back(r);
}

absl::Status BlockTables::Apply(const ModelBatch& batch, std::vector<BlockTableUpdate>* updates) {
  const uint64_t stamp = ++stamp_;  // advanced even on failure: a failed batch's stamps never match
  // 1. Validate everything before touching anything.
  released_.clear();
  int64_t rows_freed = static_cast<int64_t>(step_rows_.size());
  for (const int64_t id : batch.released_seq_ids) {
    if (by_seq_.contains(id) && released_.insert(id).second) ++rows_freed;
  }
  new_seqs_.clear();
  int64_t rows_needed = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    const int32_t start = chunk.block_table_start;
    if (start < 0) return absl::InvalidArgumentError("a chunk's block_table_start is negative");
    bool needs_row = true;
    if (chunk.seq_id == kNoSeqId) {
      if (start != 0)
        return absl::InvalidArgumentError("a chunk without a seq_id carries a partial block table");
    } else {
      const auto it = by_seq_.find(chunk.seq_id);
      if (it != by_seq_.end() && !released_.contains(chunk.seq_id)) {
        Row& row = rows_[static_cast<size_t>(it->second)];
        if (row.stamp == stamp)
          return absl::InvalidArgumentError(absl::StrCat("sequence ", chunk.seq_id, " is twice in the batch"));
        row.stamp = stamp;  // NOTE: harmless if this batch is refused: no later Apply has this stamp
        if (static_cast<size_t>(start) > row.blocks.size())
          return absl::InvalidArgumentError(absl::StrCat("sequence ", chunk.seq_id, " keeps ", row.blocks.size(),
                                                         " blocks; a delta cannot start at ", start));
        needs_row = false;
      } else {
        if (start != 0)
          return absl::InvalidArgumentError(absl::StrCat("a delta from block ", start, " for sequence ", chunk.seq_id,
                                                         ", whose table the runner does not keep"));
        if (!new_seqs_.insert(chunk.seq_id).second)
          return absl::InvalidArgumentError(absl::StrCat("sequence ", chunk.seq_id, " is twice in the batch"));
      }
    }
    rows_needed += needs_row ? 1 : 0;
    const int64_t length = int64_t{start} + static_cast<int64_t>(chunk.block_table.size());
    if (options_.max_blocks_per_row > 0 && length > options_.max_blocks_per_row)
      return absl::InvalidArgumentError(absl::StrCat("a block table of ", length, " blocks exceeds the runner's ",
                                                     options_.max_blocks_per_row));
    for (const int32_t b : chunk.block_table) {
      if (b < 0 || b >= options_.num_pool_blocks)
        return absl::InvalidArgumentError(
            absl::StrCat("block id ", b, " outside the pool of ", options_.num_pool_blocks));
    }
  }
  if (options_.max_rows > 0) {
    const int64_t available =
        options_.max_rows - static_cast<int64_t>(rows_.size()) + static_cast<int64_t>(free_rows_.size()) + rows_freed;
    if (rows_needed > available)
      return absl::ResourceExhaustedError(absl::StrCat("a batch needs ", rows_needed, " new block-table rows; ",
                                                       available, " of ", options_.max_rows, " are free"));
  }

  // 2. Commit.
  for (const int32_t r : step_rows_) FreeRow(r);
  step_rows_.clear();
  for (const int64_t id : released_) {
    const auto it = by_seq_.find(id);
    FreeRow(it->second);
    by_seq_.erase(it);
  }
  const bool report = updates != nullptr && options_.max_blocks_per_row > 0;
  chunk_rows_.resize(batch.chunks.size());
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const SequenceChunk& chunk = batch.chunks[i];
    int32_t r;
    if (chunk.seq_id == kNoSeqId) {
      r = TakeRow();
      step_rows_.push_back(r);
    } else if (const auto it = by_seq_.find(chunk.seq_id); it != by_seq_.end()) {
      r = it->second;
    } else {
      r = TakeRow();
      by_seq_.emplace(chunk.seq_id, r);
    }
    chunk_rows_[i] = r;
    std::vector<int32_t>& blocks = rows_[static_cast<size_t>(r)].blocks;
    blocks.resize(static_cast<size_t>(chunk.block_table_start));
    blocks.insert(blocks.end(), chunk.block_table.begin(), chunk.block_table.end());
    if (report) {
      const int32_t base = r * options_.max_blocks_per_row + chunk.block_table_start;
      const size_t n = chunk.block_table.size(), at = updates->size();
      updates->resize(at + n);
      BlockTableUpdate* out = updates->data() + at;
      for (size_t k = 0; k < n; ++k) out[k] = {.index = base + static_cast<int32_t>(k), .block = chunk.block_table[k]};
    }
  }
  return absl::OkStatus();
}

void BlockTables::AppendAllEntries(std::vector<BlockTableUpdate>* updates) const {
  if (options_.max_blocks_per_row <= 0) return;
  for (size_t r = 0; r < rows_.size(); ++r) {
    if (!rows_[r].in_use) continue;
    const int32_t base = static_cast<int32_t>(r) * options_.max_blocks_per_row;
    for (size_t k = 0; k < rows_[r].blocks.size(); ++k)
      updates->push_back({.index = base + static_cast<int32_t>(k), .block = rows_[r].blocks[k]});
  }
}

}  // namespace kvmesh::engine
