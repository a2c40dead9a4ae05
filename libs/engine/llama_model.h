// LlamaModel: a loaded Llama-family decoder (Llama 2/3, Mistral, Qwen2) and its
// forward pass through the backend ops.
//
// Loading maps the safetensors (no copy; a .gguf file is dequantized to bf16), checks every tensor against the
// config, and asks the backend to pack the linear layers once (q/k/v fused into
// one GEMM, gate/up into another). Forward() runs a chunk of one sequence's
// tokens against its dense KV cache; the paged, batched runner reuses the same
// layer code in a later issue.
//
// Thread-safety: Forward() is not reentrant (it reuses scratch buffers); the
// engine thread owns the model. The backend must outlive the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/ops.h"
#include "engine/dense_kv_cache.h"
#include "model/gguf_model.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "model/tensor_parallel_shard.h"

namespace kvmesh::engine {

struct LoadProgress {
  std::string stage;  // "config", "weights", "pack"
  int64_t done = 0;
  int64_t total = 0;
};

struct LlamaModelOptions {
  // Called as loading advances (for a progress display); may be empty.
  std::function<void(const LoadProgress&)> on_progress;
  // Tensor parallelism: load only rank `tensor_parallel_rank`'s slice of the weights
  // (model/tensor_parallel_shard.h). The config stays the full model's.
  int32_t tensor_parallel_rank = 0;
  int32_t tensor_parallel_size = 1;
};

class LlamaModel {
 public:
  // One decoder layer's linears, packed by the backend.
  struct PackedLayer {
    std::unique_ptr<backend::PackedLinear> qkv;      // q, k, v fused: [(H + 2 Hkv) D, E]
    std::unique_ptr<backend::PackedLinear> o;        // [E, H D]
    std::unique_ptr<backend::PackedLinear> gate_up;  // gate, up fused: [2 I, E]
    std::unique_ptr<backend::PackedLinear> down;     // [E, I]
  };

  // Errors name the file and the key or tensor at fault (see model/); InvalidArgument
  // when the model cannot be split over options.tensor_parallel_size.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& model_dir,
                                                          backend::Backend& backend,
                                                          const LlamaModelOptions& options = {});
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const model::ModelConfig& config() const { return config_; }
  // This rank's slice; the whole model (size 1) without tensor parallelism.
  const model::TensorParallelShard& shard() const { return shard_; }
  const std::string& model_dir() const { return model_dir_; }

  // A cache sized for `capacity_tokens` positions of this model.
  absl::StatusOr<DenseKvCache> NewKvCache(int64_t capacity_tokens, DType kv_cache_dtype = DType::kF32) const;

  // Runs `tokens` at positions cache.num_tokens() .. + tokens.size() - 1, writes
  // their K/V into the cache and advances it. For each index i in `logit_rows`
  // (indices into `tokens`), appends vocab_size logits to *logits (f32).
  // InvalidArgument: empty chunk, a token id outside the vocabulary, a row out of
  // range. ResourceExhausted: the cache has no room for the chunk. FailedPrecondition
  // on a tensor-parallel shard (the dense path is the unsharded oracle).
  absl::Status Forward(std::span<const int32_t> tokens, DenseKvCache& cache, std::span<const int32_t> logit_rows,
                       std::vector<float>* logits);

  // Bytes of weights one decode step reads (packed linears + norms + one
  // embedding row): the numerator of the decode roofline.
  int64_t weight_bytes_per_token() const;
  // Bytes of the packed LM head alone (prefill computes it for one row only).
  int64_t lm_head_bytes() const { return lm_head_->num_bytes(); }

  // The parts, for runners that execute the same layers over another KV layout. Under
  // tensor parallelism these are this rank's slices (see shard()).
  backend::Backend& backend() const { return backend_; }
  const model::ModelWeights& weights() const { return weights_; }
  const PackedLayer& layer(size_t i) const { return layers_[i]; }
  const backend::PackedLinear& lm_head() const { return *lm_head_; }
  std::span<const float> rope_inv_freq() const { return inv_freq_; }

 private:
  LlamaModel(backend::Backend& backend) : backend_(backend) {}
  absl::Status Pack(const LlamaModelOptions& options);
  void EnsureScratch(int64_t num_tokens);

  backend::Backend& backend_;
  std::string model_dir_;
  model::ModelConfig config_;
  model::TensorParallelShard shard_;
  std::unique_ptr<model::SafetensorsStore> store_;  // safetensors: the mapped files
  std::unique_ptr<model::GgufModel> gguf_;          // GGUF: the dequantized weights
  model::ModelWeights weights_;
  std::vector<PackedLayer> layers_;
  std::unique_ptr<backend::PackedLinear> lm_head_;
  std::vector<float> inv_freq_;

  // Scratch, sized for the largest chunk seen so far.
  int64_t scratch_tokens_ = 0;
  std::vector<float> residual_, hidden_, qkv_, q_, attn_, proj_, gate_up_, act_, head_in_;
  std::vector<int32_t> positions_;
};

}  // namespace kvmesh::engine
