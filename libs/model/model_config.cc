#include "model/model_config.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "model/gguf_file.h"
#include "model/gguf_model.h"
#include "nlohmann/json.hpp"

namespace kvmesh::model {
namespace {

using Json = nlohmann::json;

std::string JsonTypeName(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

// Reads config.json fields with errors of the form "<path>: <key> ...". Keys of
// nested objects are named "rope_scaling.factor".
class ConfigReader {
 public:
  ConfigReader(const Json& object, const std::string& path, std::string prefix = "")
      : object_(object), path_(path), prefix_(std::move(prefix)) {}

  // The value at `key`, or nullptr when absent or JSON null.
  const Json* Find(const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Has(const std::string& key) const { return Find(key) != nullptr; }

  absl::Status Error(const std::string& key, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", prefix_, key, " ", ToAbsl(what)));
  }
  absl::Status Missing(const std::string& key) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": missing required key ", prefix_, key));
  }

  absl::StatusOr<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    return ToInt(key, *v);
  }

  absl::StatusOr<int64_t> ToInt(const std::string& key, const Json& v) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Error(key, "is out of range");
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    // NOTE: a few hand-edited configs write sizes as 4096.0; accept integral floats.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::trunc(d) && std::abs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    return Error(key, absl::StrCat("must be an integer, got ", JsonTypeName(v), " ", v.dump()));
  }

  absl::StatusOr<double> Number(const std::string& key, std::optional<double> fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    if (!v->is_number()) return Error(key, absl::StrCat("must be a number, got ", JsonTypeName(*v), " ", v->dump()));
    return v->get<double>();
  }

  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Error(key, absl::StrCat("must be a boolean, got ", JsonTypeName(*v), " ", v->dump()));
    return v->get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> String(const std::string& key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(key, absl::StrCat("must be a string, got ", JsonTypeName(*v), " ", v->dump()));
    return std::optional<std::string>(v->get<std::string>());
  }

  // An int, a list of ints, or absent/null (empty).
  absl::StatusOr<std::vector<int32_t>> TokenIds(const std::string& key) const {
    std::vector<int32_t> ids;
    const Json* v = Find(key);
    if (v == nullptr) return ids;
    auto add = [&](const Json& item) -> absl::Status {
      KVMESH_ASSIGN_OR_RETURN(const int64_t id, ToInt(key, item));
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return Error(key, absl::StrCat("has token id ", id, " out of range"));
      }
      ids.push_back(static_cast<int32_t>(id));
      return absl::OkStatus();
    };
    if (v->is_array()) {
      for (const Json& item : *v) KVMESH_RETURN_IF_ERROR(add(item));
    } else if (v->is_number()) {
      KVMESH_RETURN_IF_ERROR(add(*v));
    } else {
      return Error(key, absl::StrCat("must be an integer or a list of integers, got ", JsonTypeName(*v)));
    }
    return ids;
  }

 private:
  const Json& object_;
  const std::string& path_;
  const std::string prefix_;
};

absl::StatusOr<Architecture> ArchitectureOf(const std::string& model_type, const std::string& path) {
  if (model_type == "llama") return Architecture::kLlama;
  if (model_type == "mistral") return Architecture::kMistral;
  if (model_type == "qwen2") return Architecture::kQwen2;
  return absl::InvalidArgumentError(absl::StrCat(path, ": model_type '", model_type,
                                                 "' is not supported (supported: llama, mistral, qwen2)"));
}

// model_type from "model_type", else from "architectures": ["LlamaForCausalLM"].
absl::StatusOr<std::string> ModelTypeOf(const Json& root, const ConfigReader& reader, const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(std::optional<std::string> model_type, reader.String("model_type"));
  if (model_type) return *model_type;
  const Json* archs = reader.Find("architectures");
  if (archs != nullptr && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    const std::string arch = (*archs)[0].get<std::string>();
    if (arch == "LlamaForCausalLM") return std::string("llama");
    if (arch == "MistralForCausalLM") return std::string("mistral");
    if (arch == "Qwen2ForCausalLM") return std::string("qwen2");
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": architecture '", arch, "' is not supported and model_type is missing"));
  }
  return reader.Missing("model_type");
}

// rope_scaling (or transformers 5's rope_parameters): null, or an object with
// "type"/"rope_type" of default, linear or llama3.
absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& v, const std::string& key, const std::string& path) {
  RopeScaling scaling;
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, " must be an object or null, got ", JsonTypeName(v), " ", v.dump()));
  }
  ConfigReader r(v, path, key + ".");
  KVMESH_ASSIGN_OR_RETURN(std::optional<std::string> type, r.String("rope_type"));
  if (!type) {
    KVMESH_ASSIGN_OR_RETURN(type, r.String("type"));
  }
  if (!type) return r.Missing("type");
  if (*type == "default") return scaling;
  if (*type != "linear" && *type != "llama3") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ".type '", *type,
                                                   "' is not supported (supported: default, linear, llama3)"));
  }
  KVMESH_ASSIGN_OR_RETURN(const double factor, r.Number("factor", std::nullopt));
  if (!(factor > 0)) return r.Error("factor", absl::StrCat("must be positive, got ", factor));
  scaling.factor = static_cast<float>(factor);
  if (*type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    return scaling;
  }
  scaling.type = RopeScalingType::kLlama3;
  KVMESH_ASSIGN_OR_RETURN(const double low, r.Number("low_freq_factor", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(const double high, r.Number("high_freq_factor", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                          r.Int("original_max_position_embeddings", std::nullopt));
  if (!(low > 0)) return r.Error("low_freq_factor", absl::StrCat("must be positive, got ", low));
  if (!(high > low)) {
    return r.Error("high_freq_factor", absl::StrCat("(", high, ") must exceed low_freq_factor (", low, ")"));
  }
  if (scaling.original_max_position_embeddings <= 0) {
    return r.Error("original_max_position_embeddings",
                   absl::StrCat("must be positive, got ", scaling.original_max_position_embeddings));
  }
  scaling.low_freq_factor = static_cast<float>(low);
  scaling.high_freq_factor = static_cast<float>(high);
  return scaling;
}

absl::StatusOr<DType> ParseTorchDType(const std::string& name, const std::string& key, const std::string& path) {
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16" || name == "half") return DType::kF16;
  if (name == "float32" || name == "float") return DType::kF32;
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " '", name,
                                                 "' is not supported (supported: bfloat16, float16, float32)"));
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON"));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": top level must be a JSON object, got ", JsonTypeName(root)));
  }
  const ConfigReader r(root, path);
  ModelConfig c;
  KVMESH_ASSIGN_OR_RETURN(c.model_type, ModelTypeOf(root, r, path));
  KVMESH_ASSIGN_OR_RETURN(c.architecture, ArchitectureOf(c.model_type, path));

  KVMESH_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_hidden_layers, r.Int("num_hidden_layers", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_attention_heads, r.Int("num_attention_heads", std::nullopt));
  KVMESH_ASSIGN_OR_RETURN(c.num_key_value_heads, r.Int("num_key_value_heads", c.num_attention_heads));
  KVMESH_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", c.max_position_embeddings));

  // 1. Sizes are positive.
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                   {"hidden_size", c.hidden_size},
                                   {"intermediate_size", c.intermediate_size},
                                   {"num_hidden_layers", c.num_hidden_layers},
                                   {"num_attention_heads", c.num_attention_heads},
                                   {"num_key_value_heads", c.num_key_value_heads},
                                   {"max_position_embeddings", c.max_position_embeddings}}) {
    if (value <= 0) return r.Error(key, absl::StrCat("must be positive, got ", value));
  }
  // 2. Heads: kv heads divide heads (grouped-query attention); head_dim is given
  //    or heads divide hidden.
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": num_key_value_heads (", c.num_key_value_heads,
                                                   ") must divide num_attention_heads (", c.num_attention_heads,
                                                   ")"));
  }
  if (r.Has("head_dim")) {
    KVMESH_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", std::nullopt));
    if (c.head_dim <= 0) return r.Error("head_dim", absl::StrCat("must be positive, got ", c.head_dim));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": num_attention_heads (", c.num_attention_heads,
                                                     ") must divide hidden_size (", c.hidden_size,
                                                     ") when head_dim is absent"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return r.Error("head_dim", absl::StrCat("must be even for RoPE, got ", c.head_dim));

  // 3. Norm and RoPE.
  KVMESH_ASSIGN_OR_RETURN(const double eps, r.Number("rms_norm_eps", c.rms_norm_eps));
  if (!(eps > 0)) return r.Error("rms_norm_eps", absl::StrCat("must be positive, got ", eps));
  c.rms_norm_eps = static_cast<float>(eps);

  // transformers 5 writes {"rope_parameters": {"rope_type": ..., "rope_theta": ...}}.
  const Json* rope_parameters = r.Find("rope_parameters");
  double theta = c.rope_theta;
  if (rope_parameters != nullptr && rope_parameters->is_object() && rope_parameters->contains("rope_theta")) {
    KVMESH_ASSIGN_OR_RETURN(theta, ConfigReader(*rope_parameters, path, "rope_parameters.")
                                       .Number("rope_theta", std::nullopt));
  }
  KVMESH_ASSIGN_OR_RETURN(theta, r.Number("rope_theta", theta));
  if (!(theta > 0)) return r.Error("rope_theta", absl::StrCat("must be positive, got ", theta));
  c.rope_theta = static_cast<float>(theta);
  if (const Json* scaling = r.Find("rope_scaling")) {
    KVMESH_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*scaling, "rope_scaling", path));
  } else if (rope_parameters != nullptr) {
    KVMESH_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*rope_parameters, "rope_parameters", path));
  }

  // 4. Weights layout.
  KVMESH_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  KVMESH_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
  // NOTE: Qwen2's q/k/v projections always carry a bias; its config has no key for it.
  if (c.architecture == Architecture::kQwen2) c.attention_bias = true;

  // transformers 5 renamed torch_dtype to dtype.
  KVMESH_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.String("torch_dtype"));
  std::string dtype_key = "torch_dtype";
  if (!dtype) {
    KVMESH_ASSIGN_OR_RETURN(dtype, r.String("dtype"));
    dtype_key = "dtype";
  }
  if (dtype) {
    KVMESH_ASSIGN_OR_RETURN(c.torch_dtype, ParseTorchDType(*dtype, dtype_key, path));
  }

  // 5. Special tokens and attention window.
  KVMESH_ASSIGN_OR_RETURN(c.bos_token_ids, r.TokenIds("bos_token_id"));
  KVMESH_ASSIGN_OR_RETURN(c.eos_token_ids, r.TokenIds("eos_token_id"));
  KVMESH_ASSIGN_OR_RETURN(const bool use_sliding_window, r.Bool("use_sliding_window", true));
  if (r.Has("sliding_window")) {
    KVMESH_ASSIGN_OR_RETURN(const int64_t window, r.Int("sliding_window", std::nullopt));
    if (window <= 0) return r.Error("sliding_window", absl::StrCat("must be positive, got ", window));
    // Qwen2 lists a window but disables it with use_sliding_window: false.
    if (use_sliding_window) c.sliding_window = window;
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) return LoadGgufModelConfig(model_dir);
  const std::string path = JoinPath(model_dir, "config.json");
  KVMESH_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return ParseModelConfig(text, path);
}

// NOTE: mirrors transformers' f32 arithmetic step by step, one rounding per
// torch op (kept as separate statements so no FMA contraction merges two):
//   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))
// torch's CPU pow goes through SLEEF powf (error <= 1 ulp); we use the
// correctly rounded value (pow in double, rounded once), so an element may
// differ from torch by 1 ulp where SLEEF rounds the other way.
std::vector<float> ModelConfig::RopeInverseFrequencies() const {
  const int64_t dim = head_dim;
  const float base = rope_theta;
  std::vector<float> inv_freq;
  inv_freq.reserve(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim; i += 2) {
    const float exponent = static_cast<float>(i) / static_cast<float>(dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    inv_freq.push_back(1.0f / power);
  }
  switch (rope_scaling.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (float& f : inv_freq) f = f / rope_scaling.factor;
      break;
    case RopeScalingType::kLlama3: {
      // Python scalars meet f32 tensors: each scalar is rounded to f32 first.
      const float factor = rope_scaling.factor;
      const float low_freq_factor = rope_scaling.low_freq_factor;
      const float high_freq_factor = rope_scaling.high_freq_factor;
      const double old_context_len = static_cast<double>(rope_scaling.original_max_position_embeddings);
      const float low_freq_wavelen = static_cast<float>(old_context_len / static_cast<double>(low_freq_factor));
      const float high_freq_wavelen = static_cast<float>(old_context_len / static_cast<double>(high_freq_factor));
      const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
      const float old_context_len_f = static_cast<float>(old_context_len);
      const float freq_factor_span =
          static_cast<float>(static_cast<double>(high_freq_factor) - static_cast<double>(low_freq_factor));
      for (float& f : inv_freq) {
        const float wavelen = two_pi / f;
        // wavelen > low_freq_wavelen: divide by factor; otherwise keep.
        const float inv_freq_llama = wavelen > low_freq_wavelen ? f / factor : f;
        const float ratio = old_context_len_f / wavelen;
        const float shifted = ratio - low_freq_factor;
        const float smooth_factor = shifted / freq_factor_span;
        const float one_minus = 1.0f - smooth_factor;
        const float a = one_minus * inv_freq_llama;
        const float a_scaled = a / factor;
        const float b = smooth_factor * inv_freq_llama;
        const float smoothed = a_scaled + b;
        const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        f = is_medium_freq ? smoothed : inv_freq_llama;
      }
      break;
    }
  }
  return inv_freq;
}

}  // namespace kvmesh::model
