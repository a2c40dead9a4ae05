// How a device runner lays one step's metadata out in a single buffer (pinned on the host,
// copied to the device in one transfer), and how it pads decode steps for CUDA graphs.
// Host-only arithmetic, so it is tested where no GPU is (the CUDA runner uses it as is).
//
// Decode steps (every chunk one token) are padded to a batch-size bucket (1, 2, 4, ...,
// capped at max_num_seqs) and a context bucket (256, 512, ..., capped at max_model_len),
// the shape a captured graph replays: block-table rows as long as the context bucket, and
// padding rows whose KV slot is -1 (they write no KV), whose context is 1 token over block
// 0 (a finite, discarded result) and whose token id and position are 0. Every decode row
// goes through the LM head; the host keeps the wanted ones. Other steps keep their own
// sizes and compute only the wanted logits rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model_runner.h"
#include "engine/step_metadata.h"

namespace kvmesh::engine {

// Byte offsets of the step metadata inside one buffer (the same on host and device), each
// 256-byte aligned.
struct StagingLayout {
  size_t slots = 0, token_ids = 0, positions = 0, query_start = 0, context_lens = 0, logit_rows = 0,
         block_tables = 0, block_copies = 0, total = 0;

  // Room for steps of up to max_tokens rows and max_seqs sequences with block-table rows
  // of up to max_blocks_per_seq, and max_block_copies (src, dst) pairs.
  static StagingLayout For(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq,
                           int64_t max_block_copies);
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
  // Bytes from the buffer's start that the device needs this step (up to the block
  // tables' end).
  size_t upload_bytes = 0;
};

// Writes `meta` (of `batch`) into `staging` (laid out as `layout`, large enough for the
// step: the runner checks the step against its limits first) and returns its shape.
StagedStep StageStep(const StepMetadata& meta, const ModelBatch& batch, const StagingLayout& layout,
                     const StagingLimits& limits, std::byte* staging);

}  // namespace kvmesh::engine
