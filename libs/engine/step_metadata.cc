#include "engine/step_metadata.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvmesh::engine {

absl::Status BuildStepMetadata(const ModelBatch& batch, const BlockTables& tables, int32_t block_size,
                               int32_t vocab, bool with_block_tables, StepMetadata* out) {
  StepMetadata& m = *out;
  m.token_ids.clear();
  m.positions.clear();
  m.slots.clear();
  m.logit_rows.clear();
  m.context_lens.clear();
  m.table_rows.clear();
  m.block_tables.clear();
  m.query_start.assign(1, 0);
  m.max_blocks_per_seq = 1;
  m.max_query_len = 0;
  m.max_context_len = 0;
  for (size_t s = 0; s < batch.chunks.size(); ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int32_t n = static_cast<int32_t>(chunk.token_ids.size());
    if (n == 0) return absl::InvalidArgumentError("a sequence chunk has no tokens");
    const int32_t end = chunk.start_position + n;
    const int32_t blocks_needed = (end + block_size - 1) / block_size;
    const std::span<const int32_t> table = tables.row(tables.chunk_row(s));
    if (chunk.start_position < 0 || static_cast<int32_t>(table.size()) < blocks_needed)
      return absl::InvalidArgumentError(
          absl::StrCat("block table of ", table.size(), " blocks cannot hold positions up to ", end));
    m.max_blocks_per_seq = std::max(m.max_blocks_per_seq, blocks_needed);
    m.max_query_len = std::max(m.max_query_len, n);
    m.max_context_len = std::max(m.max_context_len, end);
  }
  for (size_t s = 0; s < batch.chunks.size(); ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const std::span<const int32_t> table = tables.row(tables.chunk_row(s));
    const int32_t n = static_cast<int32_t>(chunk.token_ids.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t id = chunk.token_ids[i];
      if (id < 0 || id >= vocab)
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
      const int32_t pos = chunk.start_position + i;
      m.token_ids.push_back(id);
      m.positions.push_back(pos);
      m.slots.push_back(static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size);
    }
    m.query_start.push_back(m.query_start.back() + n);
    m.context_lens.push_back(chunk.start_position + n);
    m.table_rows.push_back(tables.chunk_row(s));
    if (chunk.all_logits) {
      for (int32_t i = 0; i < n; ++i) m.logit_rows.push_back(m.query_start[s] + i);
    } else if (chunk.compute_logits) {
      m.logit_rows.push_back(m.query_start.back() - 1);
    }
  }
  if (with_block_tables) {
    m.block_tables.assign(batch.chunks.size() * static_cast<size_t>(m.max_blocks_per_seq), 0);
    for (size_t s = 0; s < batch.chunks.size(); ++s) {
      const std::span<const int32_t> table = tables.row(tables.chunk_row(s));
      const int32_t blocks_needed = (m.context_lens[s] + block_size - 1) / block_size;
      std::copy_n(table.begin(), blocks_needed,
                  m.block_tables.begin() + static_cast<std::ptrdiff_t>(s * m.max_blocks_per_seq));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
