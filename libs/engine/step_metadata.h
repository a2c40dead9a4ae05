// The per-step metadata a paged runner derives from a ModelBatch: flattened token ids and
// positions, each new token's KV slot, the attention batch's query offsets, context
// lengths and block tables, and the rows whose logits are wanted. One function so that
// the CPU runner and the CUDA runner accept and reject exactly the same batches.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model_runner.h"

namespace kvmesh::engine {

struct StepMetadata {
  std::vector<int32_t> token_ids, positions;  // [T]
  std::vector<int64_t> slots;                 // [T] block * B + offset
  std::vector<int32_t> query_start;           // [S + 1]
  std::vector<int32_t> context_lens;          // [S]
  std::vector<int32_t> block_tables;          // [S, max_blocks_per_seq], unused entries 0
  std::vector<int32_t> logit_rows;            // rows of T whose logits are wanted, in chunk order
  int32_t max_blocks_per_seq = 1;
  int32_t max_query_len = 0;
  int32_t max_context_len = 0;
};

// Fills *out from `batch` (reusing its vectors' capacity). InvalidArgument for an empty
// chunk, a token id outside [0, vocab_size), a negative start or a block table too short
// for the chunk, a block id outside [0, num_blocks).
absl::Status BuildStepMetadata(const ModelBatch& batch, int32_t block_size, int32_t num_blocks, int32_t vocab_size,
                               StepMetadata* out);

}  // namespace kvmesh::engine
