// ModelConfig: what kvmesh needs from a Hugging Face `config.json` of a
// Llama-family decoder (Llama 2/3, Mistral, Qwen2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace kvmesh::model {

enum class Architecture : uint8_t { kLlama, kMistral, kQwen2 };

enum class RopeScalingType : uint8_t { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  // llama3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // "llama", "mistral", "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (true for Qwen2)
  DType torch_dtype = DType::kBF16;
  std::vector<int32_t> bos_token_ids;
  std::vector<int32_t> eos_token_ids;  // config.json's eos_token_id: an int or a list
  std::optional<int64_t> sliding_window;  // Mistral; informational (kvmesh attends to all)

  // RoPE inverse frequencies [head_dim / 2] with rope_scaling applied, in f32 as
  // transformers computes them.
  std::vector<float> RopeInverseFrequencies() const;
};

// Parses config.json text. `path` only names the file in errors, e.g.
// "config.json: num_attention_heads (7) must divide hidden_size (512)".
// InvalidArgument on malformed JSON, missing or mistyped keys, inconsistent values,
// or an unsupported architecture.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path);

// Reads <model_dir>/config.json, or the metadata of a GGUF file (a path ending
// in .gguf, see gguf_model.h).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace kvmesh::model
