#include "engine/llama_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

TensorView F32(std::vector<float>& buffer, int64_t rows, int64_t cols) {
  return TensorView::Contiguous(buffer.data(), DType::kF32, {rows, cols});
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                              backend::Backend& backend,
                                                              const LlamaModelOptions& options) {
  auto progress = [&](const char* stage, int64_t done, int64_t total) {
    if (options.on_progress) options.on_progress(LoadProgress{stage, done, total});
  };
  std::unique_ptr<LlamaModel> model(new LlamaModel(backend));
  model->model_dir_ = model_dir;
  model::ModelWeights full;
  if (model::IsGgufPath(model_dir)) {
    // A GGUF file: config and tokenizer from its metadata, weights dequantized to bf16.
    progress("weights", 0, 1);
    KVMESH_ASSIGN_OR_RETURN(model->gguf_, model::LoadGgufModel(model_dir));
    model->config_ = model->gguf_->config;
    full = model->gguf_->weights;
  } else {
    progress("config", 0, 1);
    KVMESH_ASSIGN_OR_RETURN(model->config_, model::LoadModelConfig(model_dir));
    progress("config", 1, 1);
    progress("weights", 0, 1);
    KVMESH_ASSIGN_OR_RETURN(model->store_, model::SafetensorsStore::Open(model_dir));
    KVMESH_ASSIGN_OR_RETURN(full, model::BindModelWeights(model->config_, *model->store_));
  }
  KVMESH_ASSIGN_OR_RETURN(model->shard_,
                          model::ComputeTensorParallelShard(model->config_, options.tensor_parallel_rank,
                                                            options.tensor_parallel_size));
  // Views of this rank's slice of the mmap: packing below reads only those bytes.
  model->weights_ = model::ShardModelWeights(full, model->config_, model->shard_);
  progress("weights", 1, 1);
  KVMESH_RETURN_IF_ERROR(model->Pack(options));
  model->inv_freq_ = model->config_.RopeInverseFrequencies();
  return model;
}

absl::Status LlamaModel::Pack(const LlamaModelOptions& options) {
  const int64_t n = static_cast<int64_t>(weights_.layers.size());
  layers_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const model::LayerWeights& w = weights_.layers[i];
    PackedLayer& layer = layers_[i];
    const TensorView qkv_parts[] = {w.q_proj, w.k_proj, w.v_proj};
    std::vector<TensorView> qkv_biases;
    if (w.q_bias) qkv_biases = {*w.q_bias, *w.k_bias, *w.v_bias};
    KVMESH_ASSIGN_OR_RETURN(layer.qkv, backend_.PackLinear(qkv_parts, qkv_biases));
    std::span<const TensorView> o_bias;
    if (w.o_bias) o_bias = {&*w.o_bias, 1};
    KVMESH_ASSIGN_OR_RETURN(layer.o, backend_.PackLinear({&w.o_proj, 1}, o_bias));
    const TensorView gate_up_parts[] = {w.gate_proj, w.up_proj};
    KVMESH_ASSIGN_OR_RETURN(layer.gate_up, backend_.PackLinear(gate_up_parts, {}));
    KVMESH_ASSIGN_OR_RETURN(layer.down, backend_.PackLinear({&w.down_proj, 1}, {}));
    if (options.on_progress) options.on_progress(LoadProgress{"pack", i + 1, n + 1});
  }
  KVMESH_ASSIGN_OR_RETURN(lm_head_, backend_.PackLinear({&weights_.lm_head, 1}, {}));
  if (options.on_progress) options.on_progress(LoadProgress{"pack", n + 1, n + 1});
  return absl::OkStatus();
}

absl::StatusOr<DenseKvCache> LlamaModel::NewKvCache(int64_t capacity_tokens, DType kv_cache_dtype) const {
  return DenseKvCache::Create(config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
                              capacity_tokens, kv_cache_dtype);
}

int64_t LlamaModel::weight_bytes_per_token() const {
  int64_t bytes = lm_head_->num_bytes() + weights_.norm.num_bytes() +
                  weights_.embed_tokens.dim(1) * DTypeSize(weights_.embed_tokens.dtype);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const PackedLayer& l = layers_[i];
    bytes += l.qkv->num_bytes() + l.o->num_bytes() + l.gate_up->num_bytes() + l.down->num_bytes();
    bytes += weights_.layers[i].input_layernorm.num_bytes() + weights_.layers[i].post_attention_layernorm.num_bytes();
  }
  return bytes;
}

void LlamaModel::EnsureScratch(int64_t t) {
  if (t <= scratch_tokens_) return;
  const int64_t e = config_.hidden_size, d = config_.head_dim;
  const int64_t h = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const int64_t inter = config_.intermediate_size;
  residual_.resize(t * e);
  hidden_.resize(t * e);
  qkv_.resize(t * (h + 2 * hkv) * d);
  q_.resize(t * h * d);
  attn_.resize(t * h * d);
  proj_.resize(t * e);
  gate_up_.resize(t * 2 * inter);
  act_.resize(t * inter);
  head_in_.resize(t * e);
  positions_.resize(t);
  scratch_tokens_ = t;
}

absl::Status LlamaModel::Forward(std::span<const int32_t> tokens, DenseKvCache& cache,
                                 std::span<const int32_t> logit_rows, std::vector<float>* logits) {
  if (!backend_.uses_host_memory())
    return absl::FailedPreconditionError(absl::StrCat("the dense path computes in host memory, not on ",
                                                      std::string(backend_.name()),
                                                      " (on a GPU the paged CUDA runner computes)"));
  const int64_t t = static_cast<int64_t>(tokens.size());
  if (shard_.is_sharded())
    return absl::FailedPreconditionError("Forward: the dense path runs the whole model, not a tensor-parallel shard");
  if (t == 0) return absl::InvalidArgumentError("Forward: empty token chunk");
  for (int32_t id : tokens) {
    if (id < 0 || id >= config_.vocab_size)
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
  }
  for (int32_t row : logit_rows) {
    if (row < 0 || row >= t)
      return absl::InvalidArgumentError(absl::StrCat("logit row ", row, " outside the chunk of ", t, " tokens"));
  }
  const int64_t start = cache.num_tokens();
  if (start + t > cache.capacity_tokens())
    return absl::ResourceExhaustedError(absl::StrCat("KV cache holds ", cache.capacity_tokens(), " positions; ",
                                                     start, " used and ", t, " more requested"));
  EnsureScratch(t);
  const int64_t e = config_.hidden_size, d = config_.head_dim;
  const int64_t h = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const int64_t inter = config_.intermediate_size;
  const int64_t qkv_width = (h + 2 * hkv) * d;
  const float eps = config_.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < t; ++i) positions_[i] = static_cast<int32_t>(start + i);
  const std::span<const int32_t> positions(positions_.data(), t);

  TensorView residual = F32(residual_, t, e);
  TensorView hidden = F32(hidden_, t, e);
  TensorView proj = F32(proj_, t, e);
  backend_.Embedding(tokens, weights_.embed_tokens, residual);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerWeights& w = weights_.layers[l];
    if (l == 0) {
      backend_.RmsNorm(residual, w.input_layernorm, eps, hidden);
    } else {
      backend_.AddRmsNorm(residual, proj, w.input_layernorm, eps, hidden);
    }
    backend_.Linear(hidden, *layers_[l].qkv, F32(qkv_, t, qkv_width));
    // Split the fused projection: q to scratch, k and v straight into their cache slots.
    TensorView k_slots = cache.key_slots(l, start, t);
    TensorView v_slots = cache.value_slots(l, start, t);
    for (int64_t i = 0; i < t; ++i) {
      const float* row = qkv_.data() + i * qkv_width;
      std::memcpy(q_.data() + i * h * d, row, sizeof(float) * h * d);
      std::memcpy(k_slots.data_as<float>() + i * hkv * d, row + h * d, sizeof(float) * hkv * d);
      std::memcpy(v_slots.data_as<float>() + i * hkv * d, row + (h + hkv) * d, sizeof(float) * hkv * d);
    }
    TensorView q = TensorView::Contiguous(q_.data(), DType::kF32, {t, h, d});
    backend_.ApplyRope(q, k_slots, positions, inv_freq_);
    cache.RoundToStoragePrecision(static_cast<int64_t>(l), start, t);
    TensorView attn = TensorView::Contiguous(attn_.data(), DType::kF32, {t, h, d});
    backend_.DenseAttention(q, cache.keys(l, start + t), cache.values(l, start + t), positions, scale, attn);
    backend_.Linear(F32(attn_, t, h * d), *layers_[l].o, proj);
    backend_.AddRmsNorm(residual, proj, w.post_attention_layernorm, eps, hidden);
    backend_.Linear(hidden, *layers_[l].gate_up, F32(gate_up_, t, 2 * inter));
    backend_.SiluAndMul(F32(gate_up_, t, 2 * inter), F32(act_, t, inter));
    backend_.Linear(F32(act_, t, inter), *layers_[l].down, proj);
  }
  cache.Advance(t);
  if (logit_rows.empty()) return absl::OkStatus();
  // The final norm and LM head run only on the rows whose logits are wanted.
  const int64_t r = static_cast<int64_t>(logit_rows.size());
  for (int64_t i = 0; i < r; ++i) {
    const int64_t row = logit_rows[i];
    for (int64_t j = 0; j < e; ++j) residual_[row * e + j] += proj_[row * e + j];
    std::memcpy(head_in_.data() + i * e, residual_.data() + row * e, sizeof(float) * e);
  }
  TensorView head_in = F32(head_in_, r, e);
  backend_.RmsNorm(head_in, weights_.norm, eps, head_in);
  const size_t offset = logits->size();
  logits->resize(offset + r * config_.vocab_size);
  backend_.Linear(head_in, *lm_head_,
                  TensorView::Contiguous(logits->data() + offset, DType::kF32, {r, config_.vocab_size}));
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
