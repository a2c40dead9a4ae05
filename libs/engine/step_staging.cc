#include "engine/step_staging.h"

#include <algorithm>

namespace kvmesh::engine {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Copies `values` to `offset` and pads with `pad` up to `count` elements.
template <typename T, typename Pad>
void Put(std::byte* staging, size_t offset, const std::vector<T>& values, Pad pad, int64_t count) {
  T* dst = reinterpret_cast<T*>(staging + offset);
  std::copy(values.begin(), values.end(), dst);
  std::fill(dst + values.size(), dst + count, static_cast<T>(pad));
}

}  // namespace

StagingLayout StagingLayout::For(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq,
                                 int64_t max_table_updates, int64_t max_block_copies) {
  StagingLayout m;
  size_t at = 0;
  auto take = [&at](int64_t bytes) {
    const size_t offset = at;
    at += AlignUp(static_cast<size_t>(bytes));
    return offset;
  };
  m.slots = take(sizeof(int64_t) * max_tokens);
  m.token_ids = take(sizeof(int32_t) * max_tokens);
  m.positions = take(sizeof(int32_t) * max_tokens);
  m.query_start = take(sizeof(int32_t) * (max_seqs + 1));
  m.context_lens = take(sizeof(int32_t) * max_seqs);
  m.logit_rows = take(sizeof(int32_t) * max_seqs);
  m.table_rows = take(sizeof(int32_t) * max_seqs);
  m.table_updates = take(sizeof(BlockTableUpdate) * max_table_updates);
  m.block_tables = take(sizeof(int32_t) * max_seqs * max_blocks_per_seq);
  m.block_copies = take(sizeof(int32_t) * 2 * max_block_copies);
  m.total = at;
  m.max_table_updates = max_table_updates;
  return m;
}

StagedStep StageStep(const StepMetadata& meta, const ModelBatch& batch, std::span<const BlockTableUpdate> updates,
                     const StagingLayout& layout, const StagingLimits& limits, std::byte* staging) {
  const int64_t t = static_cast<int64_t>(meta.token_ids.size());
  const int64_t s = static_cast<int64_t>(batch.chunks.size());
  StagedStep step;
  step.decode = meta.max_query_len == 1;
  step.rows = t;
  step.seqs = s;
  step.max_query_len = meta.max_query_len;
  step.max_blocks_per_seq = meta.max_blocks_per_seq;
  step.max_context_len = meta.max_context_len;
  if (step.decode) {
    int64_t batch_bucket = 1;
    while (batch_bucket < s) batch_bucket *= 2;
    step.rows = step.seqs = std::min<int64_t>(batch_bucket, limits.max_num_seqs);
    int64_t context_bucket = kMinContextBucket;
    while (context_bucket < meta.max_context_len) context_bucket *= 2;
    step.max_context_len = static_cast<int32_t>(std::min<int64_t>(context_bucket, limits.max_model_len));
    step.max_blocks_per_seq = (step.max_context_len + limits.block_size_tokens - 1) / limits.block_size_tokens;
  }
  Put(staging, layout.slots, meta.slots, int64_t{-1}, step.rows);
  Put(staging, layout.token_ids, meta.token_ids, 0, step.rows);
  Put(staging, layout.positions, meta.positions, 0, step.rows);
  Put(staging, layout.context_lens, meta.context_lens, 1, step.seqs);
  Put(staging, layout.table_rows, meta.table_rows, -1, step.seqs);
  int32_t* query_start = reinterpret_cast<int32_t*>(staging + layout.query_start);
  std::copy(meta.query_start.begin(), meta.query_start.end(), query_start);
  for (int64_t i = s + 1; i <= step.seqs; ++i) query_start[i] = query_start[i - 1] + 1;  // one row per padding seq
  std::copy(updates.begin(), updates.end(), reinterpret_cast<BlockTableUpdate*>(staging + layout.table_updates));
  step.num_table_updates = static_cast<int64_t>(updates.size());
  int32_t* logit_row_ids = reinterpret_cast<int32_t*>(staging + layout.logit_rows);
  if (step.decode) {
    for (int64_t i = 0; i < step.seqs; ++i) logit_row_ids[i] = static_cast<int32_t>(i);
    step.logit_rows = step.seqs;
    for (int64_t i = 0; i < s; ++i) {
      if (batch.chunks[static_cast<size_t>(i)].compute_logits) step.wanted.push_back(static_cast<int32_t>(i));
    }
  } else {
    std::copy(meta.logit_rows.begin(), meta.logit_rows.end(), logit_row_ids);
    step.logit_rows = static_cast<int64_t>(meta.logit_rows.size());
    for (int64_t i = 0; i < step.logit_rows; ++i) step.wanted.push_back(static_cast<int32_t>(i));
  }
  step.upload_bytes = layout.table_updates + sizeof(BlockTableUpdate) * updates.size();
  return step;
}

void GatherBlockTableRows(std::span<const int32_t> row_array, int64_t row_stride, std::span<const int32_t> table_rows,
                          std::span<const int32_t> context_lens, int32_t block_size_tokens, int64_t seqs,
                          int64_t max_blocks_per_seq, int32_t* out) {
  for (int64_t i = 0; i < seqs; ++i) {
    const int32_t r = table_rows[static_cast<size_t>(i)];
    const int64_t blocks =
        r < 0 ? 0
              : std::min<int64_t>({(int64_t{context_lens[static_cast<size_t>(i)]} + block_size_tokens - 1) /
                                       block_size_tokens,
                                   max_blocks_per_seq, row_stride});
    for (int64_t j = 0; j < max_blocks_per_seq; ++j)
      out[i * max_blocks_per_seq + j] = j < blocks ? row_array[static_cast<size_t>(r * row_stride + j)] : 0;
  }
}

}  // namespace kvmesh::engine
