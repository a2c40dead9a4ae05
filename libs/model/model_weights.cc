#include "model/model_weights.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace kvmesh::model {
namespace {

std::string ShapeString(std::initializer_list<int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ShapeString(const TensorView& v) {
  std::vector<int64_t> dims(v.shape.begin(), v.shape.begin() + v.rank);
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Binds one tensor: present, float, and exactly `expected` in shape.
absl::StatusOr<TensorView> Bind(const SafetensorsStore& store, const std::string& name,
                                std::initializer_list<int64_t> expected) {
  if (!store.Contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is missing from checkpoint ", store.dir(),
                                                   ": expected shape ", ShapeString(expected)));
  }
  const std::string file = store.FileOf(name);
  KVMESH_ASSIGN_OR_RETURN(const TensorView view, store.Get(name));
  bool same = view.rank == static_cast<int>(expected.size());
  int i = 0;
  for (int64_t d : expected) {
    if (!same) break;
    same = view.shape[i++] == d;
  }
  if (!same) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", file, ": expected shape ",
                                                   ShapeString(expected), ", found ", ShapeString(view)));
  }
  if (view.dtype != DType::kF32 && view.dtype != DType::kBF16 && view.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", file, ": dtype ",
                                                   ToAbsl(DTypeName(view.dtype)),
                                                   " is not supported for weights (f32, bf16, f16)"));
  }
  return view;
}

}  // namespace

absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config, const SafetensorsStore& store) {
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  const int64_t inter = config.intermediate_size;
  const int64_t q_dim = config.num_attention_heads * config.head_dim;
  const int64_t kv_dim = config.num_key_value_heads * config.head_dim;

  ModelWeights w;
  KVMESH_ASSIGN_OR_RETURN(w.embed_tokens, Bind(store, "model.embed_tokens.weight", {vocab, hidden}));
  w.layers.reserve(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights l;
    KVMESH_ASSIGN_OR_RETURN(l.input_layernorm, Bind(store, p + "input_layernorm.weight", {hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.q_proj, Bind(store, p + "self_attn.q_proj.weight", {q_dim, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.k_proj, Bind(store, p + "self_attn.k_proj.weight", {kv_dim, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.v_proj, Bind(store, p + "self_attn.v_proj.weight", {kv_dim, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.o_proj, Bind(store, p + "self_attn.o_proj.weight", {hidden, q_dim}));
    if (config.attention_bias) {
      KVMESH_ASSIGN_OR_RETURN(l.q_bias, Bind(store, p + "self_attn.q_proj.bias", {q_dim}));
      KVMESH_ASSIGN_OR_RETURN(l.k_bias, Bind(store, p + "self_attn.k_proj.bias", {kv_dim}));
      KVMESH_ASSIGN_OR_RETURN(l.v_bias, Bind(store, p + "self_attn.v_proj.bias", {kv_dim}));
      // Llama with attention_bias also biases o_proj; Qwen2 does not.
      if (store.Contains(p + "self_attn.o_proj.bias")) {
        KVMESH_ASSIGN_OR_RETURN(l.o_bias, Bind(store, p + "self_attn.o_proj.bias", {hidden}));
      }
    }
    KVMESH_ASSIGN_OR_RETURN(l.post_attention_layernorm, Bind(store, p + "post_attention_layernorm.weight", {hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.gate_proj, Bind(store, p + "mlp.gate_proj.weight", {inter, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.up_proj, Bind(store, p + "mlp.up_proj.weight", {inter, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.down_proj, Bind(store, p + "mlp.down_proj.weight", {hidden, inter}));
    w.layers.push_back(l);
  }
  KVMESH_ASSIGN_OR_RETURN(w.norm, Bind(store, "model.norm.weight", {hidden}));
  // NOTE: with tied embeddings transformers ignores any lm_head.weight in the
  // checkpoint (some exports carry a copy); so do we.
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    KVMESH_ASSIGN_OR_RETURN(w.lm_head, Bind(store, "lm_head.weight", {vocab, hidden}));
  }
  return w;
}

}  // namespace kvmesh::model
