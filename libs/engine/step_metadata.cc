#include "engine/step_metadata.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvmesh::engine {

absl::Status BuildStepMetadata(const ModelBatch& batch, int32_t block_size, int32_t num_blocks, int32_t vocab,
                               StepMetadata* out) {
  StepMetadata& m = *out;
  m.token_ids.clear();
  m.positions.clear();
  m.slots.clear();
  m.logit_rows.clear();
  m.context_lens.clear();
  m.query_start.assign(1, 0);
  m.max_blocks_per_seq = 1;
  m.max_query_len = 0;
  m.max_context_len = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    const int32_t n = static_cast<int32_t>(chunk.token_ids.size());
    if (n == 0) return absl::InvalidArgumentError("a sequence chunk has no tokens");
    const int32_t end = chunk.start_position + n;
    const int32_t blocks_needed = (end + block_size - 1) / block_size;
    if (chunk.start_position < 0 || static_cast<int32_t>(chunk.block_table.size()) < blocks_needed)
      return absl::InvalidArgumentError(absl::StrCat("block table of ", chunk.block_table.size(),
                                                     " blocks cannot hold positions up to ", end));
    for (int32_t b : chunk.block_table) {
      if (b < 0 || b >= num_blocks)
        return absl::InvalidArgumentError(absl::StrCat("block id ", b, " outside the pool of ", num_blocks));
    }
    m.max_blocks_per_seq = std::max(m.max_blocks_per_seq, blocks_needed);
    m.max_query_len = std::max(m.max_query_len, n);
    m.max_context_len = std::max(m.max_context_len, end);
  }
  m.block_tables.assign(batch.chunks.size() * static_cast<size_t>(m.max_blocks_per_seq), 0);
  for (size_t s = 0; s < batch.chunks.size(); ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int32_t n = static_cast<int32_t>(chunk.token_ids.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t id = chunk.token_ids[i];
      if (id < 0 || id >= vocab)
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
      const int32_t pos = chunk.start_position + i;
      m.token_ids.push_back(id);
      m.positions.push_back(pos);
      m.slots.push_back(static_cast<int64_t>(chunk.block_table[pos / block_size]) * block_size + pos % block_size);
    }
    const int32_t blocks_needed = (chunk.start_position + n + block_size - 1) / block_size;
    std::copy(chunk.block_table.begin(), chunk.block_table.begin() + blocks_needed,
              m.block_tables.begin() + static_cast<std::ptrdiff_t>(s * m.max_blocks_per_seq));
    m.query_start.push_back(m.query_start.back() + n);
    m.context_lens.push_back(chunk.start_position + n);
    if (chunk.all_logits) {
      for (int32_t i = 0; i < n; ++i) m.logit_rows.push_back(m.query_start[s] + i);
    } else if (chunk.compute_logits) {
      m.logit_rows.push_back(m.query_start.back() - 1);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
