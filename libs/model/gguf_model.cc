#include "model/gguf_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "model/gguf_dequantize.h"

namespace kvmesh::model {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status KeyError(const GgufFile& f, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' ", what));
}

absl::StatusOr<int64_t> PositiveInt(const GgufFile& f, const std::string& key, std::optional<int64_t> fallback) {
  KVMESH_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.GetInt(key));
  if (!v) {
    if (!fallback) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key '", key, "'"));
    v = fallback;
  }
  if (*v <= 0) return KeyError(f, key, absl::StrCat("must be positive, got ", *v));
  return *v;
}

}  // namespace

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& f) {
  KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> arch, f.GetString("general.architecture"));
  if (!arch) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key 'general.architecture'"));
  if (*arch != "llama") {
    return KeyError(f, "general.architecture", absl::StrCat("is '", *arch, "'; kvmesh loads GGUF files of the llama architecture only"));
  }
  const std::string p = *arch + ".";
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.model_type = "llama";
  c.torch_dtype = DType::kBF16;
  KVMESH_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(f, p + "embedding_length", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_hidden_layers, PositiveInt(f, p + "block_count", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.intermediate_size, PositiveInt(f, p + "feed_forward_length", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_attention_heads, PositiveInt(f, p + "attention.head_count", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_key_value_heads, PositiveInt(f, p + "attention.head_count_kv", c.num_attention_heads));
  KVMESH_ASSIGN_OR_RETURN(c.max_position_embeddings, PositiveInt(f, p + "context_length", c.max_position_embeddings));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return KeyError(f, p + "attention.head_count_kv",
                    absl::StrCat("(", c.num_key_value_heads, ") must divide ", p, "attention.head_count (",
                                 c.num_attention_heads, ")"));
  }
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> key_length, f.GetInt(p + "attention.key_length"));
  if (key_length) {
    KVMESH_ASSIGN_OR_RETURN(c.head_dim, PositiveInt(f, p + "attention.key_length", std::nullopt));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return KeyError(f, p + "attention.head_count",
                      absl::StrCat("(", c.num_attention_heads, ") must divide ", p, "embedding_length (",
                                   c.hidden_size, ") when attention.key_length is absent"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return KeyError(f, p + "attention.key_length", absl::StrCat("must be even for RoPE, got ", c.head_dim));
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> value_length, f.GetInt(p + "attention.value_length"));
  if (value_length && *value_length != c.head_dim) {
    return KeyError(f, p + "attention.value_length",
                    absl::StrCat("(", *value_length, ") must equal the key length (", c.head_dim, ")"));
  }
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> rope_dims, f.GetInt(p + "rope.dimension_count"));
  if (rope_dims && *rope_dims != c.head_dim) {
    return KeyError(f, p + "rope.dimension_count",
                    absl::StrCat("is ", *rope_dims, "; kvmesh rotates whole heads (", c.head_dim, ")"));
  }

  KVMESH_ASSIGN_OR_RETURN(const std::optional<double> eps, f.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (!eps) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key '", p, "attention.layer_norm_rms_epsilon'"));
  if (!(*eps > 0)) return KeyError(f, p + "attention.layer_norm_rms_epsilon", absl::StrCat("must be positive, got ", *eps));
  c.rms_norm_eps = static_cast<float>(*eps);
  KVMESH_ASSIGN_OR_RETURN(const std::optional<double> theta, f.GetFloat(p + "rope.freq_base"));
  if (theta) {
    if (!(*theta > 0)) return KeyError(f, p + "rope.freq_base", absl::StrCat("must be positive, got ", *theta));
    c.rope_theta = static_cast<float>(*theta);
  }
  KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> scaling, f.GetString(p + "rope.scaling.type"));
  if (scaling && *scaling != "none") {
    if (*scaling != "linear") {
      return KeyError(f, p + "rope.scaling.type", absl::StrCat("'", *scaling, "' is not supported (supported: none, linear)"));
    }
    KVMESH_ASSIGN_OR_RETURN(const std::optional<double> factor, f.GetFloat(p + "rope.scaling.factor"));
    if (!factor || !(*factor > 0)) return KeyError(f, p + "rope.scaling.factor", "must be present and positive for linear scaling");
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = static_cast<float>(*factor);
  } else if (!scaling) {
    KVMESH_ASSIGN_OR_RETURN(const std::optional<double> factor, f.GetFloat(p + "rope_scale"));
    if (factor && *factor != 1.0) {
      c.rope_scaling.type = RopeScalingType::kLinear;
      c.rope_scaling.factor = static_cast<float>(*factor);
    }
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": tensor 'rope_freqs.weight' (per-frequency RoPE factors, Llama 3.1 style) is not supported"));
  }

  // Vocabulary: the explicit key, else the token list, else the embedding's rows.
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> vocab, f.GetInt(p + "vocab_size"));
  KVMESH_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (vocab) {
    c.vocab_size = *vocab;
  } else if (tokens != nullptr) {
    c.vocab_size = static_cast<int64_t>(tokens->size());
  } else if (const GgufTensorInfo* e = f.FindTensor("token_embd.weight"); e != nullptr && e->dims.size() == 2) {
    c.vocab_size = e->dims[1];
  }
  if (c.vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": no vocabulary size (", p,
                                                   "vocab_size, tokenizer.ggml.tokens, token_embd.weight all absent)"));
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> bos, f.GetInt("tokenizer.ggml.bos_token_id"));
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> eos, f.GetInt("tokenizer.ggml.eos_token_id"));
  for (const auto& [key, id, out] : {std::tuple{"tokenizer.ggml.bos_token_id", bos, &c.bos_token_ids},
                                     std::tuple{"tokenizer.ggml.eos_token_id", eos, &c.eos_token_ids}}) {
    if (!id) continue;
    if (*id < 0 || *id >= c.vocab_size) {
      return KeyError(f, key, absl::StrCat("is ", *id, ", outside the vocabulary of ", c.vocab_size));
    }
    out->push_back(static_cast<int32_t>(*id));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadGgufModelConfig(const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(const std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return GgufModelConfig(*file);
}

std::vector<uint16_t> UnpermuteQK(const std::vector<uint16_t>& rows, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<uint16_t> out(rows.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t t = 0; t < 2; ++t) {
        const int64_t src = h * head_dim + 2 * i + t;
        const int64_t dst = h * head_dim + t * half + i;
        std::memcpy(&out[dst * cols], &rows[src * cols], static_cast<size_t>(cols) * sizeof(uint16_t));
      }
    }
  }
  return out;
}

namespace {

// Dequantizes GGUF tensors into bf16 buffers owned by a GgufModel.
class Binder {
 public:
  explicit Binder(GgufModel& m) : m_(m) {}

  // `expected` is row-major (outermost first). `qk_heads` > 0 undoes the Q/K
  // row permutation over that many heads.
  absl::StatusOr<TensorView> Bind(const std::string& name, std::vector<int64_t> expected, int64_t qk_heads = 0) {
    const GgufFile& f = *m_.file;
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "' is missing: expected shape ",
                                                     ShapeString(expected)));
    }
    if (t->Shape() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "': expected shape ",
                                                     ShapeString(expected), " from the config, found ",
                                                     ShapeString(t->Shape())));
    }
    if (!CanDequantize(t->type)) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "': ggml type ",
                                                     LayoutOf(t->type)->name,
                                                     " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, "
                                                     "Q4_1, Q4_K, Q5_K, Q6_K)"));
    }
    std::vector<uint16_t> buffer(static_cast<size_t>(t->num_elements));
    if (absl::Status s = DequantizeToBf16(t->type, f.TensorData(*t), buffer); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", name, "': ", s.message()));
    }
    if (qk_heads > 0) buffer = UnpermuteQK(buffer, qk_heads, m_.config.head_dim, expected.back());
    m_.buffers.push_back(std::move(buffer));
    ++bound_;
    TensorView v;
    v.data = m_.buffers.back().data();
    v.dtype = DType::kBF16;
    v.rank = static_cast<int>(expected.size());
    int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.shape[d] = expected[d];
      v.strides[d] = stride;
      stride *= expected[d];
    }
    return v;
  }
  int64_t bound() const { return bound_; }

 private:
  GgufModel& m_;
  int64_t bound_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GgufModel>> LoadGgufModel(const std::string& path) {
  auto m = std::make_unique<GgufModel>();
  KVMESH_ASSIGN_OR_RETURN(m->file, GgufFile::Open(path));
  KVMESH_ASSIGN_OR_RETURN(m->config, GgufModelConfig(*m->file));
  const ModelConfig& c = m->config;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, inter = c.intermediate_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  // Buffers are moved into the vector: reserve so views stay valid.
  m->buffers.reserve(static_cast<size_t>(3 + 9 * c.num_hidden_layers));
  Binder b(*m);
  ModelWeights& w = m->weights;
  KVMESH_ASSIGN_OR_RETURN(w.embed_tokens, b.Bind("token_embd.weight", {vocab, hidden}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    for (const char* bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"}) {
      if (m->file->FindTensor(p + bias) != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", p, bias, "': attention biases are not supported for GGUF llama models"));
      }
    }
    LayerWeights l;
    KVMESH_ASSIGN_OR_RETURN(l.input_layernorm, b.Bind(p + "attn_norm.weight", {hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.q_proj, b.Bind(p + "attn_q.weight", {q_dim, hidden}, c.num_attention_heads));
    KVMESH_ASSIGN_OR_RETURN(l.k_proj, b.Bind(p + "attn_k.weight", {kv_dim, hidden}, c.num_key_value_heads));
    KVMESH_ASSIGN_OR_RETURN(l.v_proj, b.Bind(p + "attn_v.weight", {kv_dim, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.o_proj, b.Bind(p + "attn_output.weight", {hidden, q_dim}));
    KVMESH_ASSIGN_OR_RETURN(l.post_attention_layernorm, b.Bind(p + "ffn_norm.weight", {hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.gate_proj, b.Bind(p + "ffn_gate.weight", {inter, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.up_proj, b.Bind(p + "ffn_up.weight", {inter, hidden}));
    KVMESH_ASSIGN_OR_RETURN(l.down_proj, b.Bind(p + "ffn_down.weight", {hidden, inter}));
    w.layers.push_back(l);
  }
  KVMESH_ASSIGN_OR_RETURN(w.norm, b.Bind("output_norm.weight", {hidden}));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    KVMESH_ASSIGN_OR_RETURN(w.lm_head, b.Bind("output.weight", {vocab, hidden}));
  }
  return m;
}

}  // namespace kvmesh::model
