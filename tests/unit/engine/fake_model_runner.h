// A ModelRunner for engine tests that simulates a paged KV cache holding token ids.
//
// Execute() performs the batch's block copies, writes each chunk's token ids into the
// slots its block table maps positions to, and for chunks with compute_logits reads the
// sequence's WHOLE history back out of the cache (positions 0..end-1 through the block
// table) and returns logits that are a deterministic function of that history. So the
// logits are right only if the engine's block tables, prefix hits, copy-on-write copies
// and positions are right: an error anywhere changes the tokens a test compares against
// ReferenceCompletion. Reading a never-written slot fails the step (InvalidArgument).
//
// Thread-safety: not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/block_tables.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"

namespace kvmesh::engine::testing {

// Deterministic logits in [-4, 4) for the next token after `history`.
inline std::vector<float> HistoryLogits(std::span<const int32_t> history, int32_t vocab_size) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  for (const int32_t t : history) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  std::vector<float> logits(static_cast<size_t>(vocab_size));
  for (int32_t v = 0; v < vocab_size; ++v) {
    uint64_t x = h + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(v + 1);  // splitmix64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    logits[static_cast<size_t>(v)] = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 8.0 - 4.0);
  }
  return logits;
}

// The output tokens one sample produces when its logits are HistoryLogits of its own
// history: what the engine must produce for it, whatever the batching. `params` must be
// greedy or seeded (use RequestState-style seed + index for sample `index`).
inline std::vector<int32_t> ReferenceCompletion(std::span<const int32_t> prompt, const SamplingParams& params,
                                                std::span<const int32_t> eos_token_ids, int32_t vocab_size) {
  SequenceSampler sampler = SequenceSampler::Create(params, vocab_size, prompt, eos_token_ids).value();
  const StopChecker stop(params, eos_token_ids);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  while (true) {
    const std::vector<float> logits = HistoryLogits(history, vocab_size);
    const int32_t token = sampler.Sample(logits).value().token_id;
    sampler.Append(token);
    history.push_back(token);
    out.push_back(token);
    if (stop.Check(token, static_cast<int32_t>(out.size())).finished()) return out;
  }
}

class FakeModelRunner : public ModelRunner {
 public:
  FakeModelRunner(int32_t vocab_size, int32_t block_size_tokens, int32_t num_blocks)
      : vocab_size_(vocab_size),
        block_size_(block_size_tokens),
        num_blocks_(num_blocks),
        slots_(static_cast<size_t>(num_blocks) * block_size_tokens, -1) {}

  int32_t vocab_size() const override { return vocab_size_; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t num_blocks() const override { return num_blocks_; }
  bool returns_argmax() const override { return returns_argmax_; }
  // Honour SequenceChunk::argmax_only as a device runner does (off by default).
  void set_returns_argmax(bool on) { returns_argmax_ = on; }
  bool keeps_block_tables() const override { return keeps_block_tables_; }
  // Keep block tables between steps as the paged runners do (engine/block_tables.h), so
  // that chunks carry deltas (off by default: every chunk's table is whole).
  void set_keeps_block_tables(bool on) { keeps_block_tables_ = on; }

  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override {
    batches_.push_back(batch);
    if (fail_next_.has_value()) {
      absl::Status s = *fail_next_;
      fail_next_.reset();
      return s;
    }
    for (const KvBlockCopy& c : batch.block_copies) {
      if (c.src < 0 || c.src >= num_blocks_ || c.dst < 0 || c.dst >= num_blocks_) {
        return absl::InvalidArgumentError("block copy out of range");
      }
      for (int32_t o = 0; o < block_size_; ++o) slots_[Slot(c.dst, o)] = slots_[Slot(c.src, o)];
    }
    // Each chunk's whole table: its own, or the kept one its delta updated.
    std::vector<std::span<const int32_t>> tables;
    if (keeps_block_tables_) {
      if (absl::Status s = kept_tables_.Apply(batch, nullptr); !s.ok()) return s;
      for (size_t i = 0; i < batch.chunks.size(); ++i) tables.push_back(kept_tables_.row(kept_tables_.chunk_row(i)));
    } else {
      for (const SequenceChunk& chunk : batch.chunks) tables.push_back(chunk.block_table);
    }
    for (size_t c = 0; c < batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = batch.chunks[c];
      for (size_t i = 0; i < chunk.token_ids.size(); ++i) {
        const int32_t p = chunk.start_position + static_cast<int32_t>(i);
        absl::StatusOr<size_t> slot = SlotOf(tables[c], p);
        if (!slot.ok()) return slot.status();
        if (chunk.token_ids[i] < 0 || chunk.token_ids[i] >= vocab_size_) {
          return absl::InvalidArgumentError("token outside the vocabulary");
        }
        slots_[*slot] = chunk.token_ids[i];
      }
    }
    ModelOutput out;
    for (size_t c = 0; c < batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = batch.chunks[c];
      if (!chunk.compute_logits) continue;
      const int32_t end = chunk.start_position + static_cast<int32_t>(chunk.token_ids.size());
      std::vector<int32_t> history;
      for (int32_t p = 0; p < end; ++p) {
        absl::StatusOr<size_t> slot = SlotOf(tables[c], p);
        if (!slot.ok()) return slot.status();
        if (slots_[*slot] < 0) return absl::InvalidArgumentError(absl::StrCat("position ", p, " was never written"));
        history.push_back(slots_[*slot]);
      }
      const std::vector<float> logits = HistoryLogits(history, vocab_size_);
      if (chunk.argmax_only && returns_argmax_) {
        // Lowest id of the largest logit (these logits are finite).
        out.argmax_token_ids.push_back(
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        continue;
      }
      out.logits.insert(out.logits.end(), logits.begin(), logits.end());
    }
    if (truncate_logits_next_) {
      truncate_logits_next_ = false;
      if (!out.logits.empty()) out.logits.pop_back();
    }
    return out;
  }

  // The next Execute fails with `status` (after recording the batch).
  void FailNext(absl::Status status) { fail_next_ = std::move(status); }
  // The next Execute returns one logit too few.
  void TruncateLogitsNext() { truncate_logits_next_ = true; }
  const std::vector<ModelBatch>& batches() const { return batches_; }

 private:
  size_t Slot(int32_t block, int32_t offset) const {
    return static_cast<size_t>(block) * static_cast<size_t>(block_size_) + static_cast<size_t>(offset);
  }
  absl::StatusOr<size_t> SlotOf(std::span<const int32_t> table, int32_t position) const {
    const size_t index = static_cast<size_t>(position / block_size_);
    if (index >= table.size()) return absl::InvalidArgumentError("block table too short");
    const int32_t block = table[index];
    if (block < 0 || block >= num_blocks_) return absl::InvalidArgumentError("block id out of range");
    return Slot(block, position % block_size_);
  }

  const int32_t vocab_size_;
  const int32_t block_size_;
  const int32_t num_blocks_;
  std::vector<int32_t> slots_;  // token id per KV slot; -1: never written
  std::vector<ModelBatch> batches_;
  std::optional<absl::Status> fail_next_;
  bool truncate_logits_next_ = false;
  bool returns_argmax_ = false;
  bool keeps_block_tables_ = false;
  BlockTables kept_tables_{{.num_pool_blocks = num_blocks_}};
};

}  // namespace kvmesh::engine::testing
