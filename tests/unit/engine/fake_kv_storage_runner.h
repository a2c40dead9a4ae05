// A FakeModelRunner whose simulated KV cache lives in a real kv::KvStorage, so that KV
// blocks can be moved between engines (Engine::ExportKvBlock / ImportKvBlock) in tests.
//
// Layout: num_layers layers, 1 KV head, head_dim 1, f32. Writing token t at slot s puts
// K = t + 1 and V = (t + 1) * (layer + 2) into every layer. For chunks with
// compute_logits the runner reads the sequence's whole history back out of the cache,
// through its block table, checking that EVERY layer holds a consistent value (a block
// missing in one layer, zeroed, or from another position fails the step), and returns
// HistoryLogits of that history — so the tokens are right only if every block of every
// layer arrived where the block table says.
//
// Thread-safety: not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model_runner.h"
#include "fake_model_runner.h"
#include "kv/kv_layout.h"

namespace kvmesh::engine::testing {

class FakeKvStorageRunner : public ModelRunner {
 public:
  FakeKvStorageRunner(int32_t vocab_size, int32_t block_size_tokens, int32_t num_blocks, int32_t num_layers = 2)
      : vocab_size_(vocab_size),
        storage_(kv::KvStorage::Create({.num_layers = num_layers,
                                        .num_kv_heads = 1,
                                        .head_dim = 1,
                                        .block_size_tokens = block_size_tokens,
                                        .dtype = DType::kF32,
                                        .num_blocks = num_blocks})
                     .value()) {}

  int32_t vocab_size() const override { return vocab_size_; }
  int32_t block_size_tokens() const override { return storage_->layout().block_size_tokens(); }
  int32_t num_blocks() const override { return storage_->layout().num_blocks(); }
  kv::KvStorage* kv_storage() override { return storage_.get(); }

  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override {
    ++num_executes_;
    for (const KvBlockCopy& c : batch.block_copies) {
      if (absl::Status s = storage_->CopyBlock(kv::BlockId{c.src}, kv::BlockId{c.dst}); !s.ok()) return s;
    }
    for (const SequenceChunk& chunk : batch.chunks) {
      for (size_t i = 0; i < chunk.token_ids.size(); ++i) {
        const int32_t p = chunk.start_position + static_cast<int32_t>(i);
        absl::StatusOr<int64_t> slot = SlotOf(chunk, p);
        if (!slot.ok()) return slot.status();
        if (chunk.token_ids[i] < 0 || chunk.token_ids[i] >= vocab_size_) {
          return absl::InvalidArgumentError("token outside the vocabulary");
        }
        Write(*slot, chunk.token_ids[i]);
      }
    }
    // Every layer is written by now: report them in order, as a real runner would
    // between its layers.
    if (batch.on_layer_kv_written) {
      for (int32_t l = 0; l < storage_->layout().num_layers(); ++l) batch.on_layer_kv_written(l);
    }
    ModelOutput out;
    for (const SequenceChunk& chunk : batch.chunks) {
      if (!chunk.compute_logits) continue;
      const int32_t end = chunk.start_position + static_cast<int32_t>(chunk.token_ids.size());
      std::vector<int32_t> history;
      for (int32_t p = 0; p < end; ++p) {
        absl::StatusOr<int64_t> slot = SlotOf(chunk, p);
        if (!slot.ok()) return slot.status();
        absl::StatusOr<int32_t> token = Read(*slot, p);
        if (!token.ok()) return token.status();
        history.push_back(*token);
      }
      const std::vector<float> logits = HistoryLogits(history, vocab_size_);
      out.logits.insert(out.logits.end(), logits.begin(), logits.end());
    }
    return out;
  }

  int64_t num_executes() const { return num_executes_; }

 private:
  float* At(int32_t layer, int32_t kv, int64_t slot) {
    return reinterpret_cast<float*>(storage_->data() + storage_->layout().SlotOffset(layer, kv, 0, slot));
  }
  void Write(int64_t slot, int32_t token) {
    const float k = static_cast<float>(token + 1);
    for (int32_t l = 0; l < storage_->layout().num_layers(); ++l) {
      *At(l, 0, slot) = k;
      *At(l, 1, slot) = k * static_cast<float>(l + 2);
    }
  }
  absl::StatusOr<int32_t> Read(int64_t slot, int32_t position) {
    const float k = *At(0, 0, slot);
    if (k < 1.0f) return absl::InvalidArgumentError(absl::StrCat("position ", position, " was never written"));
    for (int32_t l = 0; l < storage_->layout().num_layers(); ++l) {
      if (*At(l, 0, slot) != k || *At(l, 1, slot) != k * static_cast<float>(l + 2)) {
        return absl::InvalidArgumentError(absl::StrCat("the KV of position ", position, " differs in layer ", l));
      }
    }
    return static_cast<int32_t>(k) - 1;
  }
  absl::StatusOr<int64_t> SlotOf(const SequenceChunk& chunk, int32_t position) const {
    const int32_t bs = storage_->layout().block_size_tokens();
    const size_t index = static_cast<size_t>(position / bs);
    if (index >= chunk.block_table.size()) return absl::InvalidArgumentError("block table too short");
    const int32_t block = chunk.block_table[index];
    if (block < 0 || block >= storage_->layout().num_blocks()) {
      return absl::InvalidArgumentError("block id out of range");
    }
    return static_cast<int64_t>(block) * bs + position % bs;
  }

  const int32_t vocab_size_;
  std::unique_ptr<kv::KvStorage> storage_;
  int64_t num_executes_ = 0;
};

}  // namespace kvmesh::engine::testing
