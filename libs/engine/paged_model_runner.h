// PagedModelRunner: executes a ModelBatch — prefill chunks and decode steps of
// many sequences at once — through a LlamaModel's layers over a paged KV pool.
//
// Tokens of all chunks are flattened into one [T, hidden] activation, so every
// linear layer runs as one GEMM per step; attention runs per sequence over its
// block table. The layers are engine/forward_pass.h's, which the CUDA runner runs too.
//
// Under tensor parallelism (TensorParallelRunner) each rank has its own runner over
// its shard of the model (LlamaModel::shard()), a KV pool of its own KV heads only, and
// its Communicator, through which the forward pass reduces and gathers. Every rank must
// Execute the same batch.
//
// Thread-safety: not thread-safe; owned by the engine loop (or its rank's thread). The
// model (and its backend) and the communicator must outlive the runner.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/llama_model.h"
#include "engine/block_tables.h"
#include "engine/forward_pass.h"
#include "engine/model_runner.h"
#include "engine/step_metadata.h"
#include "kv/kv_layout.h"

namespace kvmesh::comm {
class Communicator;
}  // namespace kvmesh::comm

namespace kvmesh::engine {

struct PagedModelRunnerOptions {
  int32_t block_size_tokens = kv::kDefaultBlockSizeTokens;
  // Size the KV pool by exactly one of these.
  int64_t kv_cache_bytes = 0;
  int32_t num_blocks = 0;
  // Element type of the KV pool: kF32, or kBF16 (half the bytes a step's attention
  // reads; vLLM's kv_cache_dtype "auto" on a bf16 model).
  DType kv_cache_dtype = DType::kF32;
};

class PagedModelRunner : public ModelRunner {
 public:
  // InvalidArgument if the pool cannot hold one block, or both/neither sizes are set, or
  // `comm`'s group does not match the model's shard (a sharded model needs one).
  static absl::StatusOr<std::unique_ptr<PagedModelRunner>> Create(LlamaModel& model,
                                                                  const PagedModelRunnerOptions& options,
                                                                  comm::Communicator* comm = nullptr);

  int32_t vocab_size() const override { return static_cast<int32_t>(model_.config().vocab_size); }
  int32_t block_size_tokens() const override { return storage_->layout().block_size_tokens(); }
  int32_t num_blocks() const override { return storage_->layout().num_blocks(); }
  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override;
  bool all_position_logits() const override { return true; }
  bool keeps_block_tables() const override { return true; }
  bool verifies_swap_ins() const override { return comm_ == nullptr; }
  kv::KvStorage* kv_storage() override { return storage_.get(); }
  // This rank's block bytes times the group's size (every rank's heads in one slot).
  int64_t kv_swap_bytes_per_block() const override;
  KvSlotShape kv_slot_shape() const override;

  const kv::KvStorage& storage() const { return *storage_; }
  kv::KvStorage& storage() { return *storage_; }
  LlamaModel& model() { return model_; }

 private:
  PagedModelRunner(LlamaModel& model, std::unique_ptr<kv::KvStorage> storage, comm::Communicator* comm)
      : model_(model),
        storage_(std::move(storage)),
        comm_(comm),
        forward_(model, ForwardWeights::FromModel(model), comm),
        tables_({.num_pool_blocks = storage_->layout().num_blocks()}) {}
  absl::Status Prepare(const ModelBatch& batch);
  // The batch's lower-tier copies (ModelBatch::swap_out, then swap_in), timed.
  absl::Status RunSwaps(const ModelBatch& batch, ModelOutput& output);

  LlamaModel& model_;
  std::unique_ptr<kv::KvStorage> storage_;
  comm::Communicator* const comm_;  // null without tensor parallelism
  ForwardPass forward_;             // its activations grow with the largest step so far

  // Every kept sequence's block table, updated by each batch (engine/block_tables.h).
  BlockTables tables_;
  // Per-step metadata, rebuilt by Prepare().
  StepMetadata meta_;
  std::vector<int32_t> copy_pairs_;  // the step's block copies as (src, dst) pairs
};

}  // namespace kvmesh::engine
