#include "engine/forward_pass.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "core/status_macros.h"

namespace kvmesh::engine {

ForwardWeights ForwardWeights::FromModel(const LlamaModel& model) {
  const model::ModelWeights& w = model.weights();
  ForwardWeights out{.embed_tokens = w.embed_tokens, .final_norm = w.norm, .rope_inv_freq = model.rope_inv_freq()};
  for (const model::LayerWeights& layer : w.layers) {
    out.input_norms.push_back(layer.input_layernorm);
    out.post_norms.push_back(layer.post_attention_layernorm);
  }
  return out;
}

ForwardPass::ForwardPass(const LlamaModel& model, ForwardWeights weights, comm::Communicator* comm)
    : model_(model), be_(model.backend()), weights_(std::move(weights)), comm_(comm) {}

TensorView ForwardPass::Rows(const backend::Backend::Buffer& buffer, int64_t rows, int64_t cols) {
  return TensorView::Contiguous(buffer.data(), DType::kF32, {rows, cols});
}

absl::Status ForwardPass::Reserve(int64_t max_tokens, int64_t max_logit_rows) {
  const model::ModelConfig& c = model_.config();
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t e = c.hidden_size, d = c.head_dim, h = shard.num_heads, hkv = shard.num_kv_heads;
  const int64_t inter = shard.intermediate_size;
  auto grow = [this](std::unique_ptr<backend::Backend::Buffer>& buffer, int64_t floats,
                     std::string_view what) -> absl::Status {
    const int64_t bytes = static_cast<int64_t>(sizeof(float)) * floats;
    if (buffer != nullptr && buffer->size_bytes() >= bytes) return absl::OkStatus();
    buffer.reset();  // the old one goes first: peak memory is the new size
    KVMESH_ASSIGN_OR_RETURN(buffer, be_.Allocate(bytes, what));
    return absl::OkStatus();
  };
  if (max_tokens > max_tokens_) {
    const int64_t t = max_tokens;
    KVMESH_RETURN_IF_ERROR(grow(residual_, t * e, "the residual stream"));
    KVMESH_RETURN_IF_ERROR(grow(hidden_, t * e, "normed activations"));
    KVMESH_RETURN_IF_ERROR(grow(qkv_, t * (h + 2 * hkv) * d, "q/k/v"));
    KVMESH_RETURN_IF_ERROR(grow(q_, t * h * d, "queries"));
    KVMESH_RETURN_IF_ERROR(grow(k_, t * hkv * d, "keys"));
    KVMESH_RETURN_IF_ERROR(grow(v_, t * hkv * d, "values"));
    KVMESH_RETURN_IF_ERROR(grow(attn_, t * h * d, "attention output"));
    KVMESH_RETURN_IF_ERROR(grow(proj_, t * e, "projections"));
    KVMESH_RETURN_IF_ERROR(grow(gate_up_, t * 2 * inter, "gate/up"));
    KVMESH_RETURN_IF_ERROR(grow(act_, t * inter, "the MLP activation"));
    max_tokens_ = max_tokens;
  }
  if (max_logit_rows > max_logit_rows_) {
    const int64_t r = max_logit_rows;
    KVMESH_RETURN_IF_ERROR(grow(head_in_, r * e, "the LM head's input"));
    if (comm_ != nullptr) {
      KVMESH_RETURN_IF_ERROR(grow(local_logits_, r * shard.vocab_size, "this rank's logits"));
      KVMESH_RETURN_IF_ERROR(grow(gathered_logits_, comm_->world_size() * r * shard.vocab_size, "gathered logits"));
    }
    max_logit_rows_ = max_logit_rows;
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Embed(const ForwardStep& step, const TensorView& residual) {
  if (comm_ == nullptr) {
    be_.Embedding(step.token_ids, weights_.embed_tokens, residual);
    return absl::OkStatus();
  }
  // Vocab-parallel: each row comes from exactly one rank, the others add zeros: exact.
  be_.EmbeddingShard(step.token_ids, weights_.embed_tokens, model_.shard().vocab_begin, residual);
  return comm_->AllReduceSum(residual.data, residual.num_elements(), DType::kF32);
}

absl::Status ForwardPass::LmHead(const ForwardStep& step, const TensorView& head_in) {
  const int64_t r = head_in.dim(0);
  if (comm_ == nullptr) {
    be_.Linear(head_in, model_.lm_head(), step.logits);
  } else {
    // Vocab-parallel: every rank's [r, V_shard] slice, gathered as [rank, r, V_shard],
    // then laid out as [r, rank * V_shard + j].
    const int64_t vl = model_.shard().vocab_size;
    const TensorView local = Rows(*local_logits_, r, vl);
    be_.Linear(head_in, model_.lm_head(), local);
    KVMESH_RETURN_IF_ERROR(comm_->AllGather(local.data, gathered_logits_->data(), r * vl, DType::kF32));
    for (int p = 0; p < comm_->world_size(); ++p) {
      const TensorView part =
          TensorView::Contiguous(gathered_logits_->as<float>() + int64_t{p} * r * vl, DType::kF32, {r, vl});
      be_.CopyColumns(part, 0, step.logits, int64_t{p} * vl, vl);
    }
  }
  if (!step.argmax.empty()) be_.ArgmaxRows(step.logits, step.argmax);
  return absl::OkStatus();
}

absl::Status ForwardPass::Run(const ForwardStep& step) {
  const int64_t t = step.num_tokens, r = static_cast<int64_t>(step.logit_rows.size());
  if (t > max_tokens_ || r > max_logit_rows_) {
    return absl::InternalError(absl::StrCat("a step of ", t, " tokens and ", r, " LM head rows outgrew the ",
                                            max_tokens_, " and ", max_logit_rows_, " reserved"));
  }
  const model::ModelConfig& c = model_.config();
  const model::TensorParallelShard& shard = model_.shard();
  const int64_t e = c.hidden_size, d = c.head_dim, h = shard.num_heads, hkv = shard.num_kv_heads;
  const int64_t inter = shard.intermediate_size, qkv_width = (h + 2 * hkv) * d;
  const float eps = c.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const TensorView residual = Rows(*residual_, t, e), hidden = Rows(*hidden_, t, e), proj = Rows(*proj_, t, e);
  const TensorView qkv = Rows(*qkv_, t, qkv_width);
  const TensorView q = TensorView::Contiguous(q_->data(), DType::kF32, {t, h, d});
  const TensorView k = TensorView::Contiguous(k_->data(), DType::kF32, {t, hkv, d});
  const TensorView v = TensorView::Contiguous(v_->data(), DType::kF32, {t, hkv, d});
  const TensorView attn = TensorView::Contiguous(attn_->data(), DType::kF32, {t, h, d});
  const TensorView gate_up = Rows(*gate_up_, t, 2 * inter), act = Rows(*act_, t, inter);

  KVMESH_RETURN_IF_ERROR(Embed(step, residual));
  for (size_t l = 0; l < weights_.input_norms.size(); ++l) {
    const LlamaModel::PackedLayer& packed = model_.layer(l);
    const int32_t layer = static_cast<int32_t>(l);
    if (l == 0) {
      be_.RmsNorm(residual, weights_.input_norms[l], eps, hidden);
    } else {
      be_.AddRmsNorm(residual, proj, weights_.input_norms[l], eps, hidden);
    }
    be_.Linear(hidden, *packed.qkv, qkv);
    be_.CopyColumns(qkv, 0, Rows(*q_, t, h * d), 0, h * d);
    be_.CopyColumns(qkv, h * d, Rows(*k_, t, hkv * d), 0, hkv * d);
    be_.CopyColumns(qkv, (h + hkv) * d, Rows(*v_, t, hkv * d), 0, hkv * d);
    be_.ApplyRope(q, k, step.positions, weights_.rope_inv_freq);
    const TensorView kv_cache = step.kv_cache(layer);
    be_.WriteKvCache(k, v, step.slots, kv_cache);
    if (step.after_kv_write) step.after_kv_write(layer);
    be_.PagedAttention(q, kv_cache, step.attention, scale, attn);
    be_.Linear(Rows(*attn_, t, h * d), *packed.o, proj);
    // Row-parallel: each rank holds a partial sum over its heads.
    if (comm_ != nullptr) KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(proj.data, t * e, DType::kF32));
    be_.AddRmsNorm(residual, proj, weights_.post_norms[l], eps, hidden);
    be_.Linear(hidden, *packed.gate_up, gate_up);
    be_.SiluAndMul(gate_up, act);
    be_.Linear(act, *packed.down, proj);
    if (comm_ != nullptr) KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(proj.data, t * e, DType::kF32));
  }
  if (r == 0) return absl::OkStatus();
  // The final norm and LM head run on the wanted rows only: residual + the last MLP output.
  const TensorView head_in = Rows(*head_in_, r, e);
  be_.GatherAddRows(residual, proj, step.logit_rows, head_in);
  be_.RmsNorm(head_in, weights_.final_norm, eps, head_in);
  return LmHead(step, head_in);
}

}  // namespace kvmesh::engine
