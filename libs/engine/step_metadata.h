// The per-step metadata a paged runner derives from a ModelBatch: flattened token ids and
// positions, each new token's KV slot, the attention batch's query offsets, context
// lengths and block-table rows, and the rows whose logits are wanted. One function so that
// the CPU runner and the CUDA runner accept and reject exactly the same batches.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/block_tables.h"
#include "engine/model_runner.h"

namespace kvmesh::engine {

struct StepMetadata {
  std::vector<int32_t> token_ids, positions;  // [T]
  std::vector<int64_t> slots;                 // [T] block * B + offset
  std::vector<int32_t> query_start;           // [S + 1]
  std::vector<int32_t> context_lens;          // [S]
  std::vector<int32_t> table_rows;            // [S] each chunk's row in the runner's BlockTables
  // [S, max_blocks_per_seq], unused entries 0; filled only when asked for (the CPU
  // runner's kernels read it; a device runner gathers it from its kept rows instead).
  std::vector<int32_t> block_tables;
  std::vector<int32_t> logit_rows;            // rows of T whose logits are wanted, in chunk order
  int32_t max_blocks_per_seq = 1;
  int32_t max_query_len = 0;
  int32_t max_context_len = 0;
};

// Fills *out from `batch`, whose tables `tables` has just applied (BlockTables::Apply,
// which checks the block ids), reusing the vectors' capacity. Costs O(tokens + chunks),
// plus the tables' length with `with_block_tables`. InvalidArgument for an empty chunk, a
// token id outside [0, vocab_size), a negative start or a block table too short for the
// chunk.
absl::Status BuildStepMetadata(const ModelBatch& batch, const BlockTables& tables, int32_t block_size,
                               int32_t vocab_size, bool with_block_tables, StepMetadata* out);

}  // namespace kvmesh::engine
