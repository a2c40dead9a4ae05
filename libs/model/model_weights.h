// ModelWeights: the named tensors of a Llama-family checkpoint bound to their
// roles, with every shape checked against the ModelConfig.
//
// Views point into the SafetensorsStore's mappings (no copies): the store must
// outlive the weights.
#pragma once

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor_view.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace kvmesh::model {

struct LayerWeights {
  TensorView input_layernorm;           // [hidden]
  TensorView q_proj, k_proj, v_proj;    // [H*D, hidden], [Hkv*D, hidden], [Hkv*D, hidden]
  std::optional<TensorView> q_bias, k_bias, v_bias;  // [H*D], [Hkv*D] when attention_bias
  TensorView o_proj;                    // [hidden, H*D]
  std::optional<TensorView> o_bias;     // [hidden]; Llama with attention_bias only (Qwen2 has none)
  TensorView post_attention_layernorm;  // [hidden]
  TensorView gate_proj, up_proj;        // [intermediate, hidden]
  TensorView down_proj;                 // [hidden, intermediate]
};

struct ModelWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  TensorView norm;          // [hidden]
  TensorView lm_head;       // [vocab, hidden]; embed_tokens when tied
};

// Binds `model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...
// InvalidArgument naming the tensor, its file, and expected vs found shape when a
// tensor is missing or mis-shaped, or when dtypes are not float.
absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config, const SafetensorsStore& store);

}  // namespace kvmesh::model
