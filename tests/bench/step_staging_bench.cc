// step_staging_bench: the host time a device runner spends per decode step before the GPU
// can start, for batch 1/16/64/256 at contexts 1k/8k/32k, before and after block tables
// were kept on the device (engine/block_tables.h), in one run:
//   full_us   the old path: every sequence's whole table flattened into the step metadata
//             and copied into the pinned buffer (the pre-change BuildStepMetadata +
//             StageStep, reproduced below as `full_rebuild`)
//   whole_us  the new path fed whole tables (a chunk without a seq_id, or every sequence's
//             first step): BlockTables::Apply + BuildStepMetadata + StageStep
//   incr_us   the new path in steady-state decode: each chunk carries the one block it
//             writes into; the device scatters those and gathers the step's table itself
//   ratio     full_us / incr_us
// with the bytes each uploads, and the scheduler's share before the runner sees the batch:
//   sched_full_us / sched_incr_us  copying each sequence's table (whole / the delta) out of
//             the KV manager into the batch's chunks, as Scheduler::MakeSequenceChunk does
// Median of repeated runs.
//   step_staging_bench
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_timer.h"
#include "engine/block_tables.h"
#include "engine/step_metadata.h"
#include "engine/step_staging.h"

namespace {

using kvmesh::engine::BlockTables;
using kvmesh::engine::BlockTableUpdate;
using kvmesh::engine::ModelBatch;
using kvmesh::engine::SequenceChunk;

constexpr int32_t kBlock = 16;
constexpr int32_t kMaxModelLen = 32768;
constexpr int32_t kMaxSeqs = 256;
constexpr int32_t kVocab = 32000;

// The staging as it was before tables were kept: flatten every chunk's whole table into
// [S, max_blocks_per_seq] (checking every id), then copy it into the pinned buffer padded to
// the graph bucket. Only the block-table half of the metadata differs from today's path, so
// the rest is reproduced as it was too (tokens, slots, ...), to time the whole step.
namespace full_rebuild {

struct Meta {
  std::vector<int32_t> token_ids, positions, query_start, context_lens, block_tables, logit_rows;
  std::vector<int64_t> slots;
  int32_t max_blocks_per_seq = 1, max_query_len = 0, max_context_len = 0;
};

bool Build(const ModelBatch& batch, int32_t num_blocks, Meta* out) {
  Meta& m = *out;
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
    const int32_t end = chunk.start_position + n;
    const int32_t blocks_needed = (end + kBlock - 1) / kBlock;
    if (static_cast<int32_t>(chunk.block_table.size()) < blocks_needed) return false;
    for (int32_t b : chunk.block_table) {
      if (b < 0 || b >= num_blocks) return false;
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
      const int32_t pos = chunk.start_position + i;
      m.token_ids.push_back(chunk.token_ids[i]);
      m.positions.push_back(pos);
      m.slots.push_back(static_cast<int64_t>(chunk.block_table[pos / kBlock]) * kBlock + pos % kBlock);
    }
    const int32_t blocks_needed = (chunk.start_position + n + kBlock - 1) / kBlock;
    std::copy(chunk.block_table.begin(), chunk.block_table.begin() + blocks_needed,
              m.block_tables.begin() + static_cast<std::ptrdiff_t>(s * m.max_blocks_per_seq));
    m.query_start.push_back(m.query_start.back() + n);
    m.context_lens.push_back(chunk.start_position + n);
    if (chunk.compute_logits) m.logit_rows.push_back(m.query_start.back() - 1);
  }
  return true;
}

template <typename T, typename Pad>
void Put(std::byte* staging, size_t offset, const std::vector<T>& values, Pad pad, int64_t count) {
  T* dst = reinterpret_cast<T*>(staging + offset);
  std::copy(values.begin(), values.end(), dst);
  std::fill(dst + values.size(), dst + count, static_cast<T>(pad));
}

// Decode steps only (what the bench runs); returns the bytes uploaded.
size_t Stage(const Meta& meta, const ModelBatch& batch, const kvmesh::engine::StagingLayout& layout,
             std::byte* staging) {
  const int64_t s = static_cast<int64_t>(batch.chunks.size());
  int64_t seqs = 1;
  while (seqs < s) seqs *= 2;
  seqs = std::min<int64_t>(seqs, kMaxSeqs);
  int64_t context = kvmesh::engine::kMinContextBucket;
  while (context < meta.max_context_len) context *= 2;
  context = std::min<int64_t>(context, kMaxModelLen);
  const int64_t width = (context + kBlock - 1) / kBlock;
  Put(staging, layout.slots, meta.slots, int64_t{-1}, seqs);
  Put(staging, layout.token_ids, meta.token_ids, 0, seqs);
  Put(staging, layout.positions, meta.positions, 0, seqs);
  Put(staging, layout.context_lens, meta.context_lens, 1, seqs);
  int32_t* query_start = reinterpret_cast<int32_t*>(staging + layout.query_start);
  std::copy(meta.query_start.begin(), meta.query_start.end(), query_start);
  for (int64_t i = s + 1; i <= seqs; ++i) query_start[i] = query_start[i - 1] + 1;
  int32_t* tables = reinterpret_cast<int32_t*>(staging + layout.block_tables);
  std::fill(tables, tables + seqs * width, 0);
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(meta.block_tables.begin() + i * meta.max_blocks_per_seq, meta.max_blocks_per_seq,
                tables + i * width);
  }
  int32_t* logit_rows = reinterpret_cast<int32_t*>(staging + layout.logit_rows);
  for (int64_t i = 0; i < seqs; ++i) logit_rows[i] = static_cast<int32_t>(i);
  return layout.block_tables + sizeof(int32_t) * static_cast<size_t>(seqs * width);
}

}  // namespace full_rebuild

}  // namespace

int main() {
  std::printf("%-6s %-8s %10s %10s %10s %8s %12s %12s %14s %14s\n", "batch", "context", "full_us", "whole_us",
              "incr_us", "ratio", "full_bytes", "incr_bytes", "sched_full_us", "sched_incr_us");
  const int64_t max_blocks = kMaxModelLen / kBlock;
  // Room for every entry of 2 * max_num_seqs tables in one upload, so the whole-table path
  // stages in one piece (the CUDA runner's room is smaller: it scatters a step's excess
  // ahead, in rounds, which costs more than this). The offsets up to the updates, hence
  // the bytes a step uploads, do not depend on it.
  const auto layout =
      kvmesh::engine::StagingLayout::For(2048, kMaxSeqs, max_blocks, 2 * kMaxSeqs * max_blocks, 4 * kMaxSeqs);
  // The old layout had no table updates region: without it, this one is the old one.
  const auto old_layout = kvmesh::engine::StagingLayout::For(2048, kMaxSeqs, max_blocks, 0, 4 * kMaxSeqs);
  std::vector<std::byte> staging(layout.total);
  for (int32_t batch : {1, 16, 64, 256}) {
    for (int32_t context : {1024, 8192, 32768}) {
      // A decode step: every sequence one token at position context - 1, with its own blocks.
      const int32_t blocks = context / kBlock;
      const int32_t num_blocks = batch * blocks;
      ModelBatch whole, delta;
      for (int32_t s = 0; s < batch; ++s) {
        SequenceChunk chunk;
        chunk.token_ids = {s + 1};
        chunk.start_position = context - 1;
        chunk.block_table.resize(static_cast<size_t>(blocks));
        for (int32_t b = 0; b < blocks; ++b) chunk.block_table[static_cast<size_t>(b)] = s * blocks + b;
        chunk.compute_logits = true;
        chunk.argmax_only = true;
        SequenceChunk d = chunk;
        d.seq_id = s;
        d.block_table_start = blocks - 1;
        d.block_table = {chunk.block_table.back()};  // what the scheduler sends: the block written into
        whole.chunks.push_back(std::move(chunk));
        delta.chunks.push_back(std::move(d));
      }
      const kvmesh::engine::StagingLimits limits{
          .max_num_seqs = kMaxSeqs, .max_model_len = kMaxModelLen, .block_size_tokens = kBlock};
      const kvmesh::engine::BlockTablesOptions table_options{
          .num_pool_blocks = num_blocks, .max_rows = 2 * kMaxSeqs, .max_blocks_per_row = static_cast<int32_t>(max_blocks)};

      full_rebuild::Meta old_meta;
      size_t full_bytes = 0;
      const double full = kvmesh::bench::MedianSeconds(
          [&] {
            if (!full_rebuild::Build(whole, num_blocks, &old_meta)) std::abort();
            full_bytes = full_rebuild::Stage(old_meta, whole, old_layout, staging.data());
          },
          20, 0.2, 2000);

      kvmesh::engine::StepMetadata meta;
      std::vector<BlockTableUpdate> updates;
      BlockTables stateless(table_options);
      const double whole_s = kvmesh::bench::MedianSeconds(
          [&] {
            updates.clear();
            if (!stateless.Apply(whole, &updates).ok()) std::abort();
            if (!kvmesh::engine::BuildStepMetadata(whole, stateless, kBlock, kVocab, false, &meta).ok()) std::abort();
            kvmesh::engine::StageStep(meta, whole, updates, layout, limits, staging.data());
          },
          20, 0.2, 2000);

      // Kept tables: every sequence sent whole once (sequence ids 0..batch-1), then the
      // timed steady state re-sends each one's last block.
      BlockTables kept(table_options);
      ModelBatch first = whole;
      for (int32_t s = 0; s < batch; ++s) first.chunks[static_cast<size_t>(s)].seq_id = s;
      if (!kept.Apply(first, &updates).ok()) std::abort();
      size_t incr_bytes = 0;
      const double incr = kvmesh::bench::MedianSeconds(
          [&] {
            updates.clear();
            if (!kept.Apply(delta, &updates).ok()) std::abort();
            if (!kvmesh::engine::BuildStepMetadata(delta, kept, kBlock, kVocab, false, &meta).ok()) std::abort();
            incr_bytes = kvmesh::engine::StageStep(meta, delta, updates, layout, limits, staging.data()).upload_bytes;
          },
          20, 0.2, 20000);
      // The scheduler's copy of the tables into the chunks (the KV manager's tables stand
      // in as plain vectors).
      std::vector<std::vector<int32_t>> kv_tables;
      for (const SequenceChunk& c : whole.chunks) kv_tables.push_back(c.block_table);
      std::vector<SequenceChunk> chunks(static_cast<size_t>(batch));
      const auto copy_tables = [&](bool deltas) {
        for (size_t s = 0; s < chunks.size(); ++s) {
          const std::vector<int32_t>& table = kv_tables[s];
          const size_t from = deltas ? table.size() - 1 : 0;
          chunks[s].block_table.clear();
          chunks[s].block_table.shrink_to_fit();  // a fresh chunk each step, as the scheduler makes
          chunks[s].block_table.reserve(table.size() - from);
          for (size_t b = from; b < table.size(); ++b) chunks[s].block_table.push_back(table[b]);
        }
      };
      const double sched_full = kvmesh::bench::MedianSeconds([&] { copy_tables(false); }, 20, 0.2, 2000);
      const double sched_incr = kvmesh::bench::MedianSeconds([&] { copy_tables(true); }, 20, 0.2, 20000);
      std::printf("%-6d %-8d %10.1f %10.1f %10.2f %7.1fx %12zu %12zu %14.1f %14.2f\n", batch, context, full * 1e6,
                  whole_s * 1e6, incr * 1e6, full / incr, full_bytes, incr_bytes, sched_full * 1e6, sched_incr * 1e6);
    }
  }
  return 0;
}
