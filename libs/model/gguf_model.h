// A llama-family GGUF file as the same in-memory model objects the safetensors
// path produces: a ModelConfig from the `llama.*` metadata and ModelWeights
// bound to kvmesh's roles, every tensor dequantized to bf16 at load (see
// gguf_dequantize.h for the exact arithmetic and rounding) and the Q/K rows
// put back in Hugging Face order (llama.cpp's converter interleaves the two
// RoPE halves of each head; Unpermute undoes it).
//
// Thread-safety: GgufModel is immutable after loading.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf_file.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace kvmesh::model {

// The config from general.architecture (must be "llama") and the llama.* keys:
// context_length, embedding_length, block_count, feed_forward_length,
// attention.head_count(_kv), attention.key_length, rope.freq_base,
// attention.layer_norm_rms_epsilon, rope.scaling.{type,factor}, vocab_size
// (else the token list's length); tie_word_embeddings when output.weight is
// absent; BOS/EOS from tokenizer.ggml.*. Errors name the file and the key.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);
absl::StatusOr<ModelConfig> LoadGgufModelConfig(const std::string& path);

struct GgufModel {
  std::unique_ptr<GgufFile> file;
  ModelConfig config;
  ModelWeights weights;  // bf16 views into `buffers`
  std::vector<std::vector<uint16_t>> buffers;
};

// Opens, validates and dequantizes. InvalidArgument naming the tensor for a
// missing tensor, a shape that disagrees with the config, an unsupported type,
// or a tensor kvmesh would silently ignore (attention biases, rope_freqs).
absl::StatusOr<std::unique_ptr<GgufModel>> LoadGgufModel(const std::string& path);

// Undoes llama.cpp's per-head row permutation of Q or K ([heads * head_dim, cols]
// bf16, row-major): GGUF row h*D + 2i + t holds Hugging Face row h*D + t*D/2 + i.
std::vector<uint16_t> UnpermuteQK(const std::vector<uint16_t>& rows, int64_t heads, int64_t head_dim, int64_t cols);

}  // namespace kvmesh::model
