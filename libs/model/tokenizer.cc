// Tokenizer factories: tokenizer.json, tokenizer.model, a model directory.
#include "model/tokenizer.h"

#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "model/internal/sentencepiece_model_proto.h"
#include "model/internal/sentencepiece_tokenizer.h"
#include "model/internal/tokenizer_json.h"

namespace kvmesh::model {
namespace {

using json = nlohmann::json;

// What tokenizer_config.json says about special tokens (transformers' names).
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::string tokenizer_class;
};

std::optional<std::string> TokenContent(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

absl::StatusOr<TokenizerConfig> ReadTokenizerConfig(const std::string& path) {
  TokenizerConfig config;
  if (!FileExists(path)) return config;
  KVMESH_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    const json root = json::parse(text);
    if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
    if (root.contains("bos_token")) config.bos_token = TokenContent(root["bos_token"]);
    if (root.contains("eos_token")) config.eos_token = TokenContent(root["eos_token"]);
    if (root.contains("add_bos_token") && root["add_bos_token"].is_boolean()) {
      config.add_bos_token = root["add_bos_token"].get<bool>();
    }
    if (root.contains("add_eos_token") && root["add_eos_token"].is_boolean()) {
      config.add_eos_token = root["add_eos_token"].get<bool>();
    }
    if (root.contains("tokenizer_class") && root["tokenizer_class"].is_string()) {
      config.tokenizer_class = root["tokenizer_class"].get<std::string>();
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
  return config;
}

// Ids named by the config, else conventional names, else what the
// post-processor adds around the sequence.
void ApplyConfig(const TokenizerConfig& config, internal::PipelineTokenizer* tokenizer) {
  const auto lookup = [&](const std::optional<std::string>& name) -> std::optional<int32_t> {
    if (!name.has_value()) return std::nullopt;
    return tokenizer->TokenToId(*name);
  };
  const auto first_special = [&](std::initializer_list<const char*> names) -> std::optional<int32_t> {
    for (const char* name : names) {
      if (auto id = tokenizer->TokenToId(name); id.has_value() && tokenizer->IsSpecial(*id)) return id;
    }
    return std::nullopt;
  };
  std::optional<int32_t> bos = lookup(config.bos_token);
  if (!bos.has_value()) bos = tokenizer->bos_token_id();
  if (!bos.has_value() && tokenizer->post_processor() != nullptr) bos = tokenizer->post_processor()->leading_id();
  if (!bos.has_value()) bos = first_special({"<s>", "<|begin_of_text|>", "<bos>"});
  std::optional<int32_t> eos = lookup(config.eos_token);
  if (!eos.has_value()) eos = tokenizer->eos_token_id();
  if (!eos.has_value()) eos = first_special({"</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"});
  tokenizer->set_bos_token_id(bos);
  tokenizer->set_eos_token_id(eos);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& json_text, const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(auto tokenizer, internal::LoadTokenizerJson(json_text, path));
  ApplyConfig(TokenizerConfig{}, tokenizer.get());
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSentencePieceModel(const std::string& bytes,
                                                                            const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(auto model, internal::ParseSentencePieceModel(bytes, path));
  KVMESH_ASSIGN_OR_RETURN(auto tokenizer, internal::BuildSentencePieceTokenizer(model, {}, path));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) return LoadGgufTokenizer(model_dir);
  KVMESH_ASSIGN_OR_RETURN(TokenizerConfig config, ReadTokenizerConfig(JoinPath(model_dir, "tokenizer_config.json")));
  std::unique_ptr<internal::PipelineTokenizer> tokenizer;
  const std::string json_path = JoinPath(model_dir, "tokenizer.json");
  const std::string sp_path = JoinPath(model_dir, "tokenizer.model");
  if (FileExists(json_path)) {
    KVMESH_ASSIGN_OR_RETURN(std::string text, ReadFileToString(json_path));
    KVMESH_ASSIGN_OR_RETURN(tokenizer, internal::LoadTokenizerJson(text, json_path));
    // transformers' LlamaTokenizerFast rebuilds the post-processor from
    // add_bos_token / add_eos_token when the config sets them.
    if (absl::StrContains(config.tokenizer_class, "Llama") &&
        (config.add_bos_token.has_value() || config.add_eos_token.has_value())) {
      std::vector<int32_t> prefix, suffix;
      const auto id_of = [&](const std::optional<std::string>& name) -> std::optional<int32_t> {
        return name.has_value() ? tokenizer->TokenToId(*name) : std::nullopt;
      };
      if (config.add_bos_token.value_or(true)) {
        if (auto id = id_of(config.bos_token)) prefix.push_back(*id);
      }
      if (config.add_eos_token.value_or(false)) {
        if (auto id = id_of(config.eos_token)) suffix.push_back(*id);
      }
      tokenizer->set_post_processor(
          std::make_unique<internal::WrapPostProcessor>(std::move(prefix), std::move(suffix)));
    }
  } else if (FileExists(sp_path)) {
    KVMESH_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(sp_path));
    KVMESH_ASSIGN_OR_RETURN(auto model, internal::ParseSentencePieceModel(bytes, sp_path));
    internal::SentencePieceOptions options;
    options.add_bos = config.add_bos_token.value_or(true);
    options.add_eos = config.add_eos_token.value_or(false);
    KVMESH_ASSIGN_OR_RETURN(tokenizer, internal::BuildSentencePieceTokenizer(model, options, sp_path));
  } else {
    return absl::NotFoundError(absl::StrCat(model_dir, ": no tokenizer.json or tokenizer.model"));
  }
  ApplyConfig(config, tokenizer.get());
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace kvmesh::model
