#include "model/gguf_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/internal/pipeline_tokenizer.h"
#include "model/internal/post_processors.h"
#include "model/internal/sentencepiece_model_proto.h"
#include "model/internal/sentencepiece_tokenizer.h"
#include "model/internal/tokenizer_json.h"
#include "nlohmann/json.hpp"

namespace kvmesh::model {
namespace {

using Json = nlohmann::ordered_json;

// llama.cpp's token types (llama_token_type).
constexpr int64_t kTypeControl = 3;
constexpr int64_t kTypeUserDefined = 4;
constexpr int64_t kTypeByte = 6;

// The regexes Hugging Face's tokenizer.json files of these families split with.
constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

Json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

absl::StatusOr<Json> PreTokenizerFor(const std::string& pre, const std::string& path) {
  if (pre == "default" || pre == "gpt2" || pre.empty()) return ByteLevel(true);
  if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    return Json{{"type", "Sequence"},
                {"pretokenizers", Json::array({Json{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel(true)})}};
  }
  const char* pattern = nullptr;
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3") pattern = kLlama3Pattern;
  if (pre == "qwen2") pattern = kQwen2Pattern;
  if (pattern == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": metadata key 'tokenizer.ggml.pre' is '", pre,
        "', a pre-tokenizer kvmesh does not know (supported: default, gpt2, smollm, starcoder, refact, llama3, "
        "llama-bpe, qwen2)"));
  }
  return Json{{"type", "Sequence"},
              {"pretokenizers", Json::array({Json{{"type", "Split"},
                                                  {"pattern", {{"Regex", pattern}}},
                                                  {"behavior", "Isolated"},
                                                  {"invert", false}},
                                             ByteLevel(false)})}};
}

struct SpecialIds {
  std::optional<int32_t> bos, eos, unk;
  bool add_bos = false, add_eos = false;
};

absl::StatusOr<std::optional<int32_t>> TokenId(const GgufFile& f, const std::string& key, size_t vocab) {
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> id, f.GetInt(key));
  if (!id) return std::optional<int32_t>();
  if (*id < 0 || static_cast<uint64_t>(*id) >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' is ", *id,
                                                   ", outside the vocabulary of ", vocab, " tokens"));
  }
  return std::optional<int32_t>(static_cast<int32_t>(*id));
}

absl::StatusOr<SpecialIds> ReadSpecialIds(const GgufFile& f, size_t vocab, bool default_add_bos) {
  SpecialIds s;
  KVMESH_ASSIGN_OR_RETURN(s.bos, TokenId(f, "tokenizer.ggml.bos_token_id", vocab));
  KVMESH_ASSIGN_OR_RETURN(s.eos, TokenId(f, "tokenizer.ggml.eos_token_id", vocab));
  KVMESH_ASSIGN_OR_RETURN(s.unk, TokenId(f, "tokenizer.ggml.unknown_token_id", vocab));
  KVMESH_ASSIGN_OR_RETURN(const std::optional<bool> add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  KVMESH_ASSIGN_OR_RETURN(const std::optional<bool> add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  s.add_bos = add_bos.value_or(default_add_bos) && s.bos.has_value();
  s.add_eos = add_eos.value_or(false) && s.eos.has_value();
  return s;
}

struct Vocabulary {
  const std::vector<std::string>* tokens = nullptr;
  const std::vector<int64_t>* types = nullptr;  // may be null
};

absl::StatusOr<Vocabulary> ReadVocabulary(const GgufFile& f) {
  Vocabulary v;
  KVMESH_ASSIGN_OR_RETURN(v.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (v.tokens == nullptr || v.tokens->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key 'tokenizer.ggml.tokens'"));
  }
  KVMESH_ASSIGN_OR_RETURN(v.types, f.GetIntArray("tokenizer.ggml.token_type"));
  if (v.types != nullptr && v.types->size() != v.tokens->size()) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.token_type' has ",
                                                   v.types->size(), " entries for ", v.tokens->size(), " tokens"));
  }
  return v;
}

absl::StatusOr<std::string> ModelName(const GgufFile& f) {
  KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> model, f.GetString("tokenizer.ggml.model"));
  if (!model) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key 'tokenizer.ggml.model'"));
  return *model;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> SentencePieceFromGguf(const GgufFile& f) {
  KVMESH_ASSIGN_OR_RETURN(const Vocabulary v, ReadVocabulary(f));
  KVMESH_ASSIGN_OR_RETURN(const std::vector<double>* scores, f.GetFloatArray("tokenizer.ggml.scores"));
  if (scores == nullptr || scores->size() != v.tokens->size()) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.scores' must list one score per token (",
                                                   v.tokens->size(), ") for a llama (SentencePiece) tokenizer"));
  }
  KVMESH_ASSIGN_OR_RETURN(const SpecialIds ids, ReadSpecialIds(f, v.tokens->size(), /*default_add_bos=*/true));
  internal::SentencePieceModel m;
  m.model_type = internal::SentencePieceModel::ModelType::kBpe;
  m.normalizer_name = "identity";
  KVMESH_ASSIGN_OR_RETURN(const std::optional<bool> add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  m.add_dummy_prefix = add_space_prefix.value_or(true);
  m.remove_extra_whitespaces = false;
  m.unk_id = ids.unk.value_or(0);
  m.bos_id = ids.bos.value_or(-1);
  m.eos_id = ids.eos.value_or(-1);
  m.pieces.reserve(v.tokens->size());
  for (size_t i = 0; i < v.tokens->size(); ++i) {
    internal::SentencePieceModel::Piece p;
    p.piece = (*v.tokens)[i];
    p.score = static_cast<float>((*scores)[i]);
    const int64_t type = v.types != nullptr ? (*v.types)[i] : 1;
    if (type < 1 || type > 6) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.token_type' entry ", i,
                                                     " is ", type, ", not a token type (1..6)"));
    }
    p.type = static_cast<internal::SentencePieceModel::PieceType>(type);
    if (type == kTypeByte) m.byte_fallback = true;
    m.pieces.push_back(std::move(p));
  }
  internal::SentencePieceOptions options;
  options.add_bos = ids.add_bos;
  options.add_eos = ids.add_eos;
  KVMESH_ASSIGN_OR_RETURN(auto tokenizer, internal::BuildSentencePieceTokenizer(m, options, f.path()));
  tokenizer->set_bos_token_id(ids.bos);
  tokenizer->set_eos_token_id(ids.eos);
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace

absl::StatusOr<std::string> GgufTokenizerJson(const GgufFile& f) {
  KVMESH_ASSIGN_OR_RETURN(const std::string model, ModelName(f));
  if (model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tokenizer.ggml.model '", model, "' has no tokenizer.json form here (only gpt2)"));
  }
  KVMESH_ASSIGN_OR_RETURN(const Vocabulary v, ReadVocabulary(f));
  KVMESH_ASSIGN_OR_RETURN(const std::vector<std::string>* merges, f.GetStringArray("tokenizer.ggml.merges"));
  if (merges == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": missing required metadata key 'tokenizer.ggml.merges' for a gpt2 (BPE) tokenizer"));
  }
  KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> pre, f.GetString("tokenizer.ggml.pre"));
  KVMESH_ASSIGN_OR_RETURN(Json pre_tokenizer, PreTokenizerFor(pre.value_or("default"), f.path()));
  // NOTE: llama.cpp's BPE defaults add_bos to false when the key is absent.
  KVMESH_ASSIGN_OR_RETURN(const SpecialIds ids, ReadSpecialIds(f, v.tokens->size(), /*default_add_bos=*/false));
  const bool llama3 = pre.has_value() && (*pre == "llama3" || *pre == "llama-bpe" || *pre == "llama-v3");

  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t i = 0; i < v.tokens->size(); ++i) {
    const std::string& token = (*v.tokens)[i];
    vocab[token] = static_cast<int64_t>(i);
    const int64_t type = v.types != nullptr ? (*v.types)[i] : 1;
    if (type == kTypeControl || type == kTypeUserDefined) {
      added.push_back({{"id", i}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type != kTypeControl}, {"special", type == kTypeControl}});
    }
  }
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() || m.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.merges' entry ", i,
                                                     " ('", m, "') is not two tokens separated by one space"));
    }
  }
  Json post = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  if (ids.add_bos || ids.add_eos) {
    Json single = Json::array(), pair = Json::array(), specials = Json::object();
    auto special = [&](int32_t id) {
      const std::string& t = (*v.tokens)[static_cast<size_t>(id)];
      specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
      return Json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}};
    };
    if (ids.add_bos) single.push_back(special(*ids.bos));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (ids.add_eos) single.push_back(special(*ids.eos));
    pair = single;
    if (ids.add_bos) pair.push_back(special(*ids.bos));
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    if (ids.add_eos) pair.push_back(special(*ids.eos));
    post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
  }
  Json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", llama3},
        {"vocab", vocab},
        {"merges", *merges}}},
  };
  return root.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& f) {
  KVMESH_ASSIGN_OR_RETURN(const std::string model, ModelName(f));
  if (model == "llama") return SentencePieceFromGguf(f);
  if (model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.model' is '", model,
                                                   "' (supported: gpt2, llama)"));
  }
  KVMESH_ASSIGN_OR_RETURN(const std::string json, GgufTokenizerJson(f));
  KVMESH_ASSIGN_OR_RETURN(auto tokenizer, internal::LoadTokenizerJson(json, f.path()));
  KVMESH_ASSIGN_OR_RETURN(const Vocabulary v, ReadVocabulary(f));
  KVMESH_ASSIGN_OR_RETURN(const SpecialIds ids, ReadSpecialIds(f, v.tokens->size(), false));
  tokenizer->set_bos_token_id(ids.bos);
  tokenizer->set_eos_token_id(ids.eos);
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(const std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return TokenizerFromGguf(*file);
}

absl::StatusOr<std::optional<std::string>> GgufChatTemplate(const std::string& path) {
  KVMESH_ASSIGN_OR_RETURN(const std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  return file->GetString("tokenizer.chat_template");
}

}  // namespace kvmesh::model
