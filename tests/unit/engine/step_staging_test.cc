// StageStep (libs/engine/step_staging.cc): the metadata a device runner uploads, the
// block tables the device gathers from its kept rows, and the padding of decode steps to
// graph buckets. Host-only, so it runs everywhere, GPU or not.
#include "engine/step_staging.h"

#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlock = 16;
constexpr int32_t kRows = 16, kStride = 1024 / kBlock;

class StepStagingTest : public testing::Test {
 protected:
  // Stages `batch` (its tables applied to fresh kept tables) for a runner of up to 64
  // tokens, 8 sequences and 1024-token contexts.
  // With `keep_tables`, the tables kept from the last Stage are updated instead.
  StagedStep Stage(const ModelBatch& batch, bool keep_tables = false) {
    if (!keep_tables || tables_ == nullptr)
      tables_ = std::make_unique<BlockTables>(
          BlockTablesOptions{.num_pool_blocks = 100, .max_rows = kRows, .max_blocks_per_row = kStride});
    std::vector<BlockTableUpdate> updates;
    EXPECT_TRUE(tables_->Apply(batch, &updates).ok());
    EXPECT_TRUE(BuildStepMetadata(batch, *tables_, kBlock, /*vocab_size=*/1000, /*with_block_tables=*/false, &meta_)
                    .ok());
    layout_ = StagingLayout::For(64, 8, kStride, kRows * kStride, 32);
    buffer_.assign(layout_.total, std::byte{0xab});  // garbage: every read must have been written
    return StageStep(meta_, batch, updates, layout_,
                     {.max_num_seqs = 8, .max_model_len = 1024, .block_size_tokens = kBlock}, buffer_.data());
  }
  // The step's [seqs, max_blocks_per_seq] block table as the device builds it from the
  // staged buffer: the updates into (garbage) rows, then the gather.
  std::vector<int32_t> DeviceTables(const StagedStep& step) {
    for (const BlockTableUpdate& u : Read<BlockTableUpdate>(layout_.table_updates, step.num_table_updates))
      device_rows_[static_cast<size_t>(u.index)] = u.block;
    std::vector<int32_t> out(static_cast<size_t>(step.seqs * step.max_blocks_per_seq));
    GatherBlockTableRows(device_rows_, kStride, Read<int32_t>(layout_.table_rows, step.seqs),
                         Read<int32_t>(layout_.context_lens, step.seqs), kBlock, step.seqs, step.max_blocks_per_seq,
                         out.data());
    return out;
  }
  template <typename T>
  std::vector<T> Read(size_t offset, int64_t n) const {
    std::vector<T> out(static_cast<size_t>(n));
    std::memcpy(out.data(), buffer_.data() + offset, sizeof(T) * out.size());
    return out;
  }

  std::unique_ptr<BlockTables> tables_;
  StepMetadata meta_;
  StagingLayout layout_;
  std::vector<std::byte> buffer_;
  std::vector<int32_t> device_rows_ = std::vector<int32_t>(kRows * kStride, -5);  // the device's kept rows
};

TEST_F(StepStagingTest, LayoutRegionsAreAlignedAndDisjoint) {
  const StagingLayout l = StagingLayout::For(100, 7, 33, 70, 5);
  const std::vector<size_t> starts = {l.slots,      l.token_ids,  l.positions,     l.query_start,  l.context_lens,
                                      l.logit_rows, l.table_rows, l.table_updates, l.block_tables, l.block_copies};
  const std::vector<size_t> sizes = {8 * 100, 4 * 100, 4 * 100, 4 * 8, 4 * 7, 4 * 7, 4 * 7, 8 * 70, 4 * 7 * 33, 8 * 5};
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(starts[i] % 256, 0u) << i;
    const size_t end = starts[i] + sizes[i];
    EXPECT_LE(end, i + 1 < starts.size() ? starts[i + 1] : l.total) << i;
  }
}

TEST_F(StepStagingTest, DecodeStepIsPaddedToItsBatchAndContextBuckets) {
  // Three sequences decoding at contexts 20, 300 and 5: bucket 4, context bucket 512.
  ModelBatch batch;
  batch.chunks.push_back({{11}, 19, {7, 8}, true});
  std::vector<int32_t> long_table(19);
  for (int i = 0; i < 19; ++i) long_table[i] = 40 + i;
  batch.chunks.push_back({{12}, 299, long_table, false});  // no logits wanted
  batch.chunks.push_back({{13}, 4, {3}, true});
  const StagedStep step = Stage(batch);
  EXPECT_TRUE(step.decode);
  EXPECT_EQ(step.rows, 4);
  EXPECT_EQ(step.seqs, 4);
  EXPECT_EQ(step.max_context_len, 512);
  EXPECT_EQ(step.max_blocks_per_seq, 512 / kBlock);
  EXPECT_EQ(step.logit_rows, 4);                                // every row through the LM head
  EXPECT_EQ(step.wanted, (std::vector<int32_t>{0, 2}));         // the host keeps these
  EXPECT_EQ(Read<int32_t>(layout_.token_ids, 4), (std::vector<int32_t>{11, 12, 13, 0}));
  EXPECT_EQ(Read<int32_t>(layout_.positions, 4), (std::vector<int32_t>{19, 299, 4, 0}));
  EXPECT_EQ(Read<int64_t>(layout_.slots, 4),
            (std::vector<int64_t>{8 * kBlock + 3, 58 * kBlock + 11, 3 * kBlock + 4, -1}));
  EXPECT_EQ(Read<int32_t>(layout_.context_lens, 4), (std::vector<int32_t>{20, 300, 5, 1}));
  EXPECT_EQ(Read<int32_t>(layout_.query_start, 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Read<int32_t>(layout_.logit_rows, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Read<int32_t>(layout_.table_rows, 4)[3], -1);  // the padding row gathers zeros
  const std::vector<int32_t> tables = DeviceTables(step);
  const int64_t row = step.max_blocks_per_seq;
  EXPECT_EQ(tables[0], 7);
  EXPECT_EQ(tables[1], 8);
  EXPECT_EQ(tables[2], 0);  // past the sequence's blocks: zero
  EXPECT_EQ(tables[row + 18], 58);
  EXPECT_EQ(tables[2 * row], 3);
  for (int64_t i = 3 * row; i < 4 * row; ++i) EXPECT_EQ(tables[i], 0) << "padding row reads block 0";
  EXPECT_EQ(step.num_table_updates, 2 + 19 + 1);  // every table whole: no seq_ids
  EXPECT_EQ(step.upload_bytes, layout_.table_updates + sizeof(BlockTableUpdate) * 22);
  EXPECT_LT(step.upload_bytes, layout_.block_tables);  // the gathered tables are not uploaded
}

TEST_F(StepStagingTest, BucketsAreCappedByTheRunnersLimits) {
  ModelBatch batch;  // 5 sequences: bucket 8 (== max_num_seqs); context 1000: bucket 1024 (== max_model_len)
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> table(63);
    for (int b = 0; b < 63; ++b) table[b] = b;
    batch.chunks.push_back({{1}, i == 0 ? 999 : i, table, true});
  }
  StagedStep step = Stage(batch);
  EXPECT_EQ(step.seqs, 8);
  EXPECT_EQ(step.max_context_len, 1024);
  // A one-token context still gets the smallest context bucket.
  ModelBatch small;
  small.chunks.push_back({{1}, 0, {9}, true});
  step = Stage(small);
  EXPECT_EQ(step.seqs, 1);
  EXPECT_EQ(step.max_context_len, kMinContextBucket);
}

TEST_F(StepStagingTest, PrefillStepKeepsItsSizesAndComputesOnlyWantedRows) {
  ModelBatch batch;
  batch.chunks.push_back({{1, 2, 3, 4, 5}, 16, {4, 6}, true});  // chunk over a cached block
  batch.chunks.push_back({{9}, 2, {5}, false});                  // a decode row, no logits
  batch.chunks.push_back({{7, 8}, 0, {2}, true});
  const StagedStep step = Stage(batch);
  EXPECT_FALSE(step.decode);
  EXPECT_EQ(step.rows, 8);
  EXPECT_EQ(step.seqs, 3);
  EXPECT_EQ(step.max_query_len, 5);
  EXPECT_EQ(step.max_context_len, 21);
  EXPECT_EQ(step.max_blocks_per_seq, 2);
  EXPECT_EQ(step.logit_rows, 2);
  EXPECT_EQ(step.wanted, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Read<int32_t>(layout_.logit_rows, 2), (std::vector<int32_t>{4, 7}));  // last token of chunks 0 and 2
  EXPECT_EQ(Read<int32_t>(layout_.query_start, 4), (std::vector<int32_t>{0, 5, 6, 8}));
  EXPECT_EQ(DeviceTables(step), (std::vector<int32_t>{4, 6, 5, 0, 2, 0}));
  EXPECT_EQ(Read<int64_t>(layout_.slots, 8)[0], 6 * kBlock + 0);
}

TEST_F(StepStagingTest, DecodeStepsOfKeptSequencesUploadOneEntryEachWhateverTheContext) {
  // Two sequences with 40 and 3 blocks, sent whole once.
  std::vector<int32_t> long_table(40);
  for (int i = 0; i < 40; ++i) long_table[i] = 50 + i;
  ModelBatch first;
  first.chunks.push_back({{1}, 40 * kBlock - 2, long_table, true});
  first.chunks.push_back({{2}, 3 * kBlock - 1, {7, 8, 9}, true});
  first.chunks[0].seq_id = 100;
  first.chunks[1].seq_id = 200;
  StagedStep step = Stage(first);
  EXPECT_EQ(step.num_table_updates, 43);
  DeviceTables(step);  // the device applies them
  // Next step, in the other order: 100 decodes in its last block, 200 opens a fourth one.
  ModelBatch next;
  next.chunks.push_back({{3}, 3 * kBlock, {10}, true});
  next.chunks[0].seq_id = 200;
  next.chunks[0].block_table_start = 3;
  next.chunks.push_back({{4}, 40 * kBlock - 1, {89}, true});
  next.chunks[1].seq_id = 100;
  next.chunks[1].block_table_start = 39;
  step = Stage(next, /*keep_tables=*/true);
  EXPECT_EQ(step.num_table_updates, 2);
  EXPECT_EQ(step.upload_bytes, layout_.table_updates + 2 * sizeof(BlockTableUpdate));
  const std::vector<int32_t> tables = DeviceTables(step);
  const int64_t row = step.max_blocks_per_seq;
  ASSERT_EQ(row, 1024 / kBlock);  // context 640: bucket 1024
  EXPECT_EQ(std::vector<int32_t>(tables.begin(), tables.begin() + 5), (std::vector<int32_t>{7, 8, 9, 10, 0}));
  for (int64_t j = 0; j < 40; ++j) EXPECT_EQ(tables[row + j], 50 + j) << j;
  EXPECT_EQ(tables[row + 40], 0);
  EXPECT_EQ(Read<int64_t>(layout_.slots, 2), (std::vector<int64_t>{10 * kBlock, 89 * kBlock + kBlock - 1}));
}

}  // namespace
}  // namespace kvmesh::engine
