// BlockTables: a model runner's copy of each running sequence's block table, kept between
// steps and updated from each ModelBatch's deltas (SequenceChunk::block_table_start,
// ModelBatch::released_seq_ids in model_runner.h), so that a step costs what changed in
// the tables, not their total length. The CPU runner reads whole tables through row();
// a device runner mirrors the rows into a device array with the updates Apply() reports.
//
// Every table lives in a row: a small integer, stable while its sequence is kept, naming
// row `r` of a [max_rows, max_blocks_per_row] array (the device runner's). A chunk without
// a seq_id (kNoSeqId) gets a row for its step only, freed by the next Apply. Entries past a
// table's length keep whatever an earlier owner of the row left there: readers stop at the
// blocks their context needs.
//
// Thread-safety: not thread-safe; owned by one runner and called from its Execute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/model_runner.h"

namespace kvmesh::engine {

struct BlockTablesOptions {
  int32_t num_pool_blocks = 0;     // every entry must be a block id in [0, num_pool_blocks)
  int32_t max_rows = 0;            // 0: as many rows as the batches need
  int32_t max_blocks_per_row = 0;  // 0: no limit (and Apply reports no updates)
};

// One entry written into the row array: array[index] = block, index = row *
// max_blocks_per_row + column.
struct BlockTableUpdate {
  int32_t index = 0;
  int32_t block = 0;
};

class BlockTables {
 public:
  explicit BlockTables(const BlockTablesOptions& options) : options_(options) {}

  BlockTables(const BlockTables&) = delete;
  BlockTables& operator=(const BlockTables&) = delete;

  // Applies `batch`: frees the previous batch's step-only rows, drops released_seq_ids, then
  // writes each chunk's entries into its sequence's row (a new row for a new sequence).
  // With `updates` (and max_blocks_per_row > 0), appends every entry written to it; their
  // indices are distinct. Errors, all with no side effects:
  //   InvalidArgument: a delta (block_table_start > 0) for a sequence not kept, released in
  //     this batch or kept with fewer entries; block_table_start > 0 without a seq_id; a
  //     seq_id twice in the batch; a block id outside the pool; a table longer than
  //     max_blocks_per_row.
  //   ResourceExhausted: the batch needs more than max_rows rows.
  absl::Status Apply(const ModelBatch& batch, std::vector<BlockTableUpdate>* updates);

  // The row of chunk `i` of the last batch applied.
  int32_t chunk_row(size_t i) const { return chunk_rows_[i]; }
  // The table held in row `r` (valid until the next Apply).
  std::span<const int32_t> row(int32_t r) const { return rows_[static_cast<size_t>(r)].blocks; }
  // Appends every entry of every row in use as an update: what a device array needs to be
  // rebuilt from nothing (after a step that failed between Apply and its upload).
  void AppendAllEntries(std::vector<BlockTableUpdate>* updates) const;

  int32_t num_kept_sequences() const { return static_cast<int32_t>(by_seq_.size()); }
  int32_t num_rows_in_use() const { return static_cast<int32_t>(rows_.size() - free_rows_.size()); }
  const BlockTablesOptions& options() const { return options_; }

 private:
  struct Row {
    std::vector<int32_t> blocks;
    uint64_t stamp = 0;  // the Apply that last named this row (a seq_id twice in one batch)
    bool in_use = false;
  };

  int32_t TakeRow();
  void FreeRow(int32_t r);

  const BlockTablesOptions options_;
  std::vector<Row> rows_;
  std::vector<int32_t> free_rows_;  // rows not in use, taken from the back
  absl::flat_hash_map<int64_t, int32_t> by_seq_;
  std::vector<int32_t> step_rows_;   // rows of the last batch's chunks without a seq_id
  std::vector<int32_t> chunk_rows_;  // [chunks of the last batch]
  uint64_t stamp_ = 0;
  // Scratch of Apply, kept for their capacity.
  absl::flat_hash_set<int64_t> released_, new_seqs_;
};

}  // namespace kvmesh::engine
