// How a device runner lays one step's metadata out in a single buffer (pinned on the host,
// copied to the device in one transfer), and how it pads decode steps for CUDA graphs.
// Host-only arithmetic, so it is tested where no GPU is (the CUDA runner uses it as is).
//
// Block tables are not staged whole: the device keeps every sequence's table in a row of
// a persistent [rows, max_blocks_per_seq] array (engine/block_tables.h). A step uploads
// the entries that changed (table_updates, applied to that array first) and each
// sequence's row (table_rows); the device then gathers the step's [seqs,
// max_blocks_per_seq] table from those rows into the block_tables region (which is never
// uploaded): entry (i, j) is row table_rows[i]'s column j for the blocks that context_lens[i]
// covers, and 0 past them or for a row of -1. So a step's host time is O(tokens + seqs +
// changed entries), not O(context).
//
// Decode steps (every chunk one token) are padded to a batch-size bucket (1, 2, 4, ...,
// capped at max_num_seqs) and a context bucket (256, 512, ..., capped at max_model_len),
// the shape a captured graph replays: block-table rows as long as the context bucket, and
// padding rows whose KV slot is -1 (they write no KV), whose context is 1 token over block
// 0 (table row -1: a finite, discarded result) and whose token id and position are 0.
// Every decode row goes through the LM head; the host keeps the wanted ones. Other steps
// keep their own sizes and compute only the wanted logits rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/block_tables.h"
#include "engine/model_runner.h"
#include "engine/step_metadata.h"

namespace kvmesh::engine {

// Byte offsets of the step metadata inside one buffer (the same on host and device), each
// 256-byte aligned, in upload order: what a step uploads ends with its table updates;
// block_tables (written on the device) and block_copies (uploaded on their own) follow.
struct StagingLayout {
  size_t slots = 0, token_ids = 0, positions = 0, query_start = 0, context_lens = 0, logit_rows = 0,
         table_rows = 0, table_updates = 0, block_tables = 0, block_copies = 0, total = 0;
  int64_t max_table_updates = 0;

  // Room for steps of up to max_tokens rows and max_seqs sequences with block-table rows
  // of up to max_blocks_per_seq, max_table_updates BlockTableUpdates and max_block_copies
  // (src, dst) pairs.
  static StagingLayout For(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq,
                           int64_t max_table_updates, int64_t max_block_copies);
};

struct StagingLimits {
  int64_t max_num_seqs = 0;
  int32_t max_model_len = 0;
  int32_t block_size_tokens = 0;
};

// The smallest context bucket of a decode graph.
inline constexpr int32_t kMinContextBucket = 256;

// What the staged step runs: `rows` token rows of `seqs` sequences, `logit_rows` of them
// through the LM head; the decode kernel's grid covers max_context_len.
struct StagedStep {
  bool decode = false;
  int64_t rows = 0, seqs = 0, logit_rows = 0;
  int32_t max_blocks_per_seq = 0, max_query_len = 0, max_context_len = 0;
  // Indices into the LM head's output rows of the logits the step returns, ascending: one
  // per chunk with compute_logits, in chunk order.
  std::vector<int32_t> wanted;
  int64_t num_table_updates = 0;
  // Bytes from the buffer's start that the device needs this step (up to the table
  // updates' end).
  size_t upload_bytes = 0;
};

// Writes `meta` (of `batch`) and the table `updates` Apply reported into `staging` (laid
// out as `layout`, large enough for the step: the runner checks the step against its
// limits first, and at most layout.max_table_updates updates) and returns its shape.
StagedStep StageStep(const StepMetadata& meta, const ModelBatch& batch, std::span<const BlockTableUpdate> updates,
                     const StagingLayout& layout, const StagingLimits& limits, std::byte* staging);

// What the device's gather computes (see above), on the host: the step's [seqs,
// max_blocks_per_seq] block table from a [*, row_stride] row array. For tests and for a
// runner without a device.
void GatherBlockTableRows(std::span<const int32_t> row_array, int64_t row_stride, std::span<const int32_t> table_rows,
                          std::span<const int32_t> context_lens, int32_t block_size_tokens, int64_t seqs,
                          int64_t max_blocks_per_seq, int32_t* out);

}  // namespace kvmesh::engine
