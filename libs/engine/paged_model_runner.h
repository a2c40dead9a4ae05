// PagedModelRunner: executes a ModelBatch — prefill chunks and decode steps of
// many sequences at once — through a LlamaModel's layers over a paged KV pool.
//
// Tokens of all chunks are flattened into one [T, hidden] activation, so every
// linear layer runs as one GEMM per step; attention runs per sequence over its
// block table (Backend::PagedAttention), after the new K/V are written into
// their slots (Backend::WriteKvCache).
//
// Thread-safety: not thread-safe; owned by the engine loop. The model (and its
// backend) must outlive the runner.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "kv/kv_layout.h"

namespace kvmesh::engine {

struct PagedModelRunnerOptions {
  int32_t block_size_tokens = kv::kDefaultBlockSizeTokens;
  // Size the KV pool by exactly one of these.
  int64_t kv_cache_bytes = 0;
  int32_t num_blocks = 0;
};

class PagedModelRunner : public ModelRunner {
 public:
  // InvalidArgument if the pool cannot hold one block, or both/neither sizes are set.
  static absl::StatusOr<std::unique_ptr<PagedModelRunner>> Create(LlamaModel& model,
                                                                  const PagedModelRunnerOptions& options);

  int32_t vocab_size() const override { return static_cast<int32_t>(model_.config().vocab_size); }
  int32_t block_size_tokens() const override { return storage_->layout().block_size_tokens(); }
  int32_t num_blocks() const override { return storage_->layout().num_blocks(); }
  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override;
  kv::KvStorage* kv_storage() override { return storage_.get(); }

  const kv::KvStorage& storage() const { return *storage_; }
  kv::KvStorage& storage() { return *storage_; }
  LlamaModel& model() { return model_; }

 private:
  PagedModelRunner(LlamaModel& model, std::unique_ptr<kv::KvStorage> storage)
      : model_(model), storage_(std::move(storage)) {}
  absl::Status Prepare(const ModelBatch& batch);
  void EnsureScratch(int64_t num_tokens);

  LlamaModel& model_;
  std::unique_ptr<kv::KvStorage> storage_;

  // Per-step metadata, rebuilt by Prepare().
  std::vector<int32_t> token_ids_, positions_, query_start_, context_lens_, block_tables_, logit_rows_;
  std::vector<int64_t> slots_;
  int32_t max_blocks_per_seq_ = 0;
  // Activation scratch, sized for the largest step so far.
  int64_t scratch_tokens_ = 0;
  std::vector<float> residual_, hidden_, qkv_, q_, k_, v_, attn_, proj_, gate_up_, act_, head_in_;
};

}  // namespace kvmesh::engine
