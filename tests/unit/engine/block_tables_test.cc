// BlockTables (libs/engine/block_tables.h): the tables a runner keeps between steps, and
// the device rows the CUDA runner mirrors from its updates (step_staging.h), checked
// against tables built from scratch after every step of a randomized churn.
#include "engine/block_tables.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/step_metadata.h"
#include "engine/step_staging.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlock = 16;

SequenceChunk Chunk(int64_t seq_id, int32_t start_position, int32_t num_tokens, int32_t block_table_start,
                    std::vector<int32_t> blocks) {
  SequenceChunk c;
  c.token_ids.assign(static_cast<size_t>(num_tokens), 1);
  c.start_position = start_position;
  c.block_table = std::move(blocks);
  c.compute_logits = true;
  c.seq_id = seq_id;
  c.block_table_start = block_table_start;
  return c;
}

std::vector<int32_t> Row(const BlockTables& t, size_t chunk) {
  const std::span<const int32_t> r = t.row(t.chunk_row(chunk));
  return {r.begin(), r.end()};
}

TEST(BlockTablesTest, DeltasExtendAndRewriteTheKeptTable) {
  BlockTables t({.num_pool_blocks = 100, .max_rows = 4, .max_blocks_per_row = 8});
  ModelBatch b1;
  b1.chunks.push_back(Chunk(7, 0, 20, 0, {3, 4}));
  std::vector<BlockTableUpdate> updates;
  ASSERT_TRUE(t.Apply(b1, &updates).ok());
  EXPECT_EQ(Row(t, 0), (std::vector<int32_t>{3, 4}));
  ASSERT_EQ(updates.size(), 2u);
  const int32_t row = t.chunk_row(0);
  EXPECT_EQ(updates[1].index, row * 8 + 1);
  EXPECT_EQ(updates[1].block, 4);
  // Decode at position 32: from block 1 (rewritten by copy-on-write to 9) on, plus block 2.
  ModelBatch b2;
  b2.chunks.push_back(Chunk(7, 32, 1, 1, {9, 5}));
  updates.clear();
  ASSERT_TRUE(t.Apply(b2, &updates).ok());
  EXPECT_EQ(Row(t, 0), (std::vector<int32_t>{3, 9, 5}));
  EXPECT_EQ(t.chunk_row(0), row);  // stable while kept
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0].index, row * 8 + 1);
  EXPECT_EQ(updates[0].block, 9);
  // A batch without the sequence leaves it kept.
  ASSERT_TRUE(t.Apply(ModelBatch{}, &updates).ok());
  EXPECT_EQ(t.num_kept_sequences(), 1);
}

TEST(BlockTablesTest, MalformedDeltasAreRefusedWithoutSideEffects) {
  BlockTables t({.num_pool_blocks = 100, .max_rows = 2, .max_blocks_per_row = 4});
  ModelBatch b;
  b.chunks.push_back(Chunk(1, 0, 16, 0, {10}));
  ASSERT_TRUE(t.Apply(b, nullptr).ok());
  const auto refused = [&](ModelBatch batch, absl::StatusCode code) {
    EXPECT_EQ(t.Apply(batch, nullptr).code(), code);
    // Still exactly as before: sequence 1 keeps {10}.
    ModelBatch probe;
    probe.chunks.push_back(Chunk(1, 16, 1, 1, {11}));
    ASSERT_TRUE(t.Apply(probe, nullptr).ok());
    EXPECT_EQ(Row(t, 0), (std::vector<int32_t>{10, 11}));
    probe.chunks[0] = Chunk(1, 0, 16, 0, {10});  // back to {10}
    ASSERT_TRUE(t.Apply(probe, nullptr).ok());
    EXPECT_EQ(t.num_kept_sequences(), 1);
  };
  ModelBatch unknown;  // a delta for a sequence never sent
  unknown.chunks.push_back(Chunk(2, 16, 1, 1, {12}));
  refused(unknown, absl::StatusCode::kInvalidArgument);
  ModelBatch past_end;  // a delta starting past the kept entries
  past_end.chunks.push_back(Chunk(1, 32, 1, 2, {12}));
  refused(past_end, absl::StatusCode::kInvalidArgument);
  ModelBatch released;  // a delta for a sequence released in the same batch
  released.released_seq_ids = {1};
  released.chunks.push_back(Chunk(1, 16, 1, 1, {12}));
  refused(released, absl::StatusCode::kInvalidArgument);
  ModelBatch twice;
  twice.chunks.push_back(Chunk(1, 16, 1, 1, {12}));
  twice.chunks.push_back(Chunk(1, 16, 1, 1, {12}));
  refused(twice, absl::StatusCode::kInvalidArgument);
  ModelBatch twice_new;
  twice_new.chunks.push_back(Chunk(3, 0, 1, 0, {12}));
  twice_new.chunks.push_back(Chunk(3, 0, 1, 0, {13}));
  refused(twice_new, absl::StatusCode::kInvalidArgument);
  ModelBatch outside;  // block 100 is past the pool; the valid new sequence is not kept either
  outside.chunks.push_back(Chunk(4, 0, 1, 0, {5}));
  outside.chunks.push_back(Chunk(1, 16, 1, 1, {100}));
  refused(outside, absl::StatusCode::kInvalidArgument);
  ModelBatch too_long;
  too_long.chunks.push_back(Chunk(1, 16, 1, 1, {1, 2, 3, 4}));
  refused(too_long, absl::StatusCode::kInvalidArgument);
  ModelBatch partial_without_id;
  partial_without_id.chunks.push_back(Chunk(kNoSeqId, 16, 1, 1, {1}));
  refused(partial_without_id, absl::StatusCode::kInvalidArgument);
  ModelBatch full;  // two more rows wanted, one free
  full.chunks.push_back(Chunk(5, 0, 1, 0, {1}));
  full.chunks.push_back(Chunk(6, 0, 1, 0, {2}));
  refused(full, absl::StatusCode::kResourceExhausted);
}

TEST(BlockTablesTest, ReleasedSequencesFreeTheirRowsAndMayComeBackWhole) {
  BlockTables t({.num_pool_blocks = 100, .max_rows = 2, .max_blocks_per_row = 4});
  ModelBatch b;
  b.chunks.push_back(Chunk(1, 0, 16, 0, {10}));
  b.chunks.push_back(Chunk(2, 0, 16, 0, {20}));
  ASSERT_TRUE(t.Apply(b, nullptr).ok());
  // 1 is preempted and resumed with a new table in one batch; 2 ends and 3 takes its row.
  ModelBatch next;
  next.released_seq_ids = {1, 2, 99};  // 99 was never kept: ignored
  next.chunks.push_back(Chunk(1, 0, 20, 0, {30, 31}));
  next.chunks.push_back(Chunk(3, 0, 1, 0, {40}));
  ASSERT_TRUE(t.Apply(next, nullptr).ok());
  EXPECT_EQ(Row(t, 0), (std::vector<int32_t>{30, 31}));
  EXPECT_EQ(Row(t, 1), (std::vector<int32_t>{40}));
  EXPECT_EQ(t.num_kept_sequences(), 2);
  EXPECT_EQ(t.num_rows_in_use(), 2);
}

TEST(BlockTablesTest, ChunksWithoutASeqIdHoldARowForTheirStepOnly) {
  BlockTables t({.num_pool_blocks = 100, .max_rows = 2, .max_blocks_per_row = 4});
  ModelBatch b;
  b.chunks.push_back(Chunk(kNoSeqId, 0, 16, 0, {10}));
  b.chunks.push_back(Chunk(kNoSeqId, 0, 16, 0, {11}));
  ASSERT_TRUE(t.Apply(b, nullptr).ok());
  EXPECT_EQ(Row(t, 1), (std::vector<int32_t>{11}));
  EXPECT_EQ(t.num_kept_sequences(), 0);
  ASSERT_TRUE(t.Apply(b, nullptr).ok());  // both rows came back for this batch
  EXPECT_EQ(t.num_rows_in_use(), 2);
  ASSERT_TRUE(t.Apply(ModelBatch{}, nullptr).ok());
  EXPECT_EQ(t.num_rows_in_use(), 0);
}

// A randomized churn: sequences start (prefill in chunks), grow by decode steps, have the
// block they write into rewritten (copy-on-write), get preempted and resume with a new
// table (sometimes in the same batch), end, or run without a seq_id, in random order and
// random subsets per step, as a scheduler would send them. After every step: each chunk's
// kept row equals its true table; the CPU runner's tables (BuildStepMetadata) and the
// device's (the staged updates applied to a row array, then gathered) equal tables built
// from scratch; and a rewrite of the row array from nothing (AppendAllEntries) gathers the
// same.
TEST(BlockTablesTest, RandomChurnKeepsTablesEqualToTablesBuiltFromScratch) {
  constexpr int32_t kPool = 5000, kMaxRows = 48, kStride = 64, kMaxLen = kStride * kBlock, kMaxSeqs = 32;
  struct Sim {
    int64_t id = 0;
    std::vector<int32_t> table;  // the truth
    int32_t computed = 0;        // tokens in the KV cache
    int32_t target = 0;          // prompt length: prefill until computed reaches it
    int32_t kept = 0;            // entries the runner has (0: none)
  };
  std::mt19937 rng(20261202);
  const auto uniform = [&rng](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  std::vector<Sim> live;
  int64_t next_id = 0;
  BlockTables tables({.num_pool_blocks = kPool, .max_rows = kMaxRows, .max_blocks_per_row = kStride});
  std::vector<int32_t> device(static_cast<size_t>(kMaxRows * kStride), -7);  // garbage until written
  const StagingLayout layout = StagingLayout::For(4096, kMaxSeqs, kStride, int64_t{kMaxRows} * kStride, 0);
  std::vector<std::byte> staging(layout.total);
  const StagingLimits limits{.max_num_seqs = kMaxSeqs, .max_model_len = kMaxLen, .block_size_tokens = kBlock};
  std::vector<BlockTableUpdate> updates;
  StepMetadata meta;
  int64_t decode_steps = 0, deltas = 0, wholes = 0, cows = 0, preemptions = 0;

  for (int32_t step = 0; step < 4000; ++step) {
    ModelBatch batch;
    std::vector<std::vector<int32_t>> truth;  // per chunk
    // Ends and preemptions (their releases go with this batch; a preempted one may also
    // resume in it).
    for (size_t i = 0; i < live.size();) {
      const int32_t roll = uniform(0, 99);
      if (roll < 3 || live[i].computed + 1 >= kMaxLen) {  // ends
        if (live[i].kept > 0) batch.released_seq_ids.push_back(live[i].id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (roll < 5) {  // preempted: recomputes from nothing with new blocks
        if (live[i].kept > 0) batch.released_seq_ids.push_back(live[i].id);
        live[i].kept = 0;
        live[i].target = std::max(live[i].computed, 1);
        live[i].computed = 0;
        live[i].table.clear();
        ++preemptions;
      }
      ++i;
    }
    while (live.size() < 24 && uniform(0, 3) == 0) {
      live.push_back({.id = next_id++, .target = uniform(1, 300)});
    }
    const bool decode_only = uniform(0, 1) == 0;
    std::shuffle(live.begin(), live.end(), rng);
    for (Sim& s : live) {
      if (batch.chunks.size() >= static_cast<size_t>(kMaxSeqs) - 2 || uniform(0, 9) < 2) continue;  // not this step
      const bool prefilling = s.computed < s.target;
      if (decode_only && prefilling) continue;
      const int32_t n = prefilling ? std::min(s.target - s.computed, uniform(1, 100)) : 1;
      const int32_t end = s.computed + n;
      if (end > kMaxLen) continue;
      // The block of the first new token may be rewritten (a shared block copied on write).
      const size_t first = static_cast<size_t>(s.computed / kBlock);
      if (first < s.table.size() && uniform(0, 9) == 0) {
        s.table[first] = uniform(0, kPool - 1);
        ++cows;
      }
      while (static_cast<int32_t>(s.table.size()) * kBlock < end) s.table.push_back(uniform(0, kPool - 1));
      const int32_t from = std::min<int32_t>(s.kept, s.computed / kBlock);
      (from > 0 ? deltas : wholes) += 1;
      batch.chunks.push_back(Chunk(s.id, s.computed, n, from, {s.table.begin() + from, s.table.end()}));
      truth.push_back(s.table);
      s.kept = static_cast<int32_t>(s.table.size());
      s.computed = end;
    }
    if (!decode_only && uniform(0, 4) == 0) {  // a one-off chunk without a seq_id
      std::vector<int32_t> t(static_cast<size_t>(uniform(1, 8)));
      for (int32_t& b : t) b = uniform(0, kPool - 1);
      const int32_t start = uniform(0, static_cast<int32_t>(t.size()) * kBlock - 1);
      batch.chunks.push_back(Chunk(kNoSeqId, start, 1, 0, t));
      truth.push_back(t);
    }

    updates.clear();
    ASSERT_TRUE(tables.Apply(batch, &updates).ok()) << "step " << step;
    for (size_t i = 0; i < batch.chunks.size(); ++i) ASSERT_EQ(Row(tables, i), truth[i]) << "step " << step;
    if (batch.chunks.empty()) continue;
    ASSERT_TRUE(BuildStepMetadata(batch, tables, kBlock, 1000, /*with_block_tables=*/true, &meta).ok());
    const StagedStep staged = StageStep(meta, batch, updates, layout, limits, staging.data());
    decode_steps += staged.decode ? 1 : 0;

    // What the device does: the staged updates into its rows, then the gather.
    std::vector<BlockTableUpdate> staged_updates(static_cast<size_t>(staged.num_table_updates));
    std::memcpy(staged_updates.data(), staging.data() + layout.table_updates,
                sizeof(BlockTableUpdate) * staged_updates.size());
    ASSERT_EQ(staged.upload_bytes, layout.table_updates + sizeof(BlockTableUpdate) * staged_updates.size());
    for (const BlockTableUpdate& u : staged_updates) device[static_cast<size_t>(u.index)] = u.block;
    std::vector<int32_t> rows(static_cast<size_t>(staged.seqs)), context_lens(rows.size());
    std::memcpy(rows.data(), staging.data() + layout.table_rows, sizeof(int32_t) * rows.size());
    std::memcpy(context_lens.data(), staging.data() + layout.context_lens, sizeof(int32_t) * rows.size());
    const int64_t width = staged.max_blocks_per_seq;
    std::vector<int32_t> gathered(static_cast<size_t>(staged.seqs * width), -1);
    GatherBlockTableRows(device, kStride, rows, context_lens, kBlock, staged.seqs, width, gathered.data());

    // From scratch: each chunk's true table up to its context, zeros elsewhere (padding
    // rows too), as wide as the step's rows.
    const auto from_scratch = [&](int64_t seqs, int64_t w) {
      std::vector<int32_t> t(static_cast<size_t>(seqs * w), 0);
      for (size_t i = 0; i < batch.chunks.size(); ++i) {
        const SequenceChunk& c = batch.chunks[i];
        const int64_t blocks =
            (c.start_position + static_cast<int64_t>(c.token_ids.size()) + kBlock - 1) / kBlock;
        for (int64_t j = 0; j < std::min(blocks, w); ++j) t[i * w + j] = truth[i][static_cast<size_t>(j)];
      }
      return t;
    };
    ASSERT_EQ(gathered, from_scratch(staged.seqs, width)) << "device tables, step " << step;
    ASSERT_EQ(meta.block_tables, from_scratch(static_cast<int64_t>(batch.chunks.size()), meta.max_blocks_per_seq))
        << "host tables, step " << step;

    if (step % 97 == 0) {  // the device rows rebuilt from nothing gather the same
      std::vector<int32_t> rebuilt(device.size(), -7);
      std::vector<BlockTableUpdate> all;
      tables.AppendAllEntries(&all);
      for (const BlockTableUpdate& u : all) rebuilt[static_cast<size_t>(u.index)] = u.block;
      std::vector<int32_t> again(gathered.size(), -1);
      GatherBlockTableRows(rebuilt, kStride, rows, context_lens, kBlock, staged.seqs, width, again.data());
      ASSERT_EQ(again, gathered) << "step " << step;
    }
  }
  // The churn did what it says.
  EXPECT_GT(decode_steps, 500);
  EXPECT_GT(deltas, 10000);
  EXPECT_GT(wholes, 500);
  EXPECT_GT(cows, 500);
  EXPECT_GT(preemptions, 500);
}

}  // namespace
}  // namespace kvmesh::engine
