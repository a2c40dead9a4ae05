#include "model/internal/tokenizer_json.h"

#include <cstdint>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::model::internal {
namespace {

using json = nlohmann::json;

void AssignAddedTokenIds(const BpeModel& model, std::vector<AddedToken>* tokens);

// Context for error messages.
struct Loader {
  const std::string& path;

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  }
  absl::Status Unsupported(const std::string& kind, const std::string& type) const {
    return Error(absl::StrCat("unsupported ", kind, " '", type, "'"));
  }

  // nlohmann's get<int32_t>() casts a float such as 1e300 to int, which is
  // undefined behaviour; token ids must be JSON integers that fit int32.
  absl::StatusOr<int32_t> TokenId(const json& v, const std::string& where) const {
    if (v.is_number_integer()) {
      const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}
                             ? int64_t{-1}
                             : v.get<int64_t>();
      if (id >= 0 && id <= INT32_MAX) return static_cast<int32_t>(id);
    }
    return Error(absl::StrCat(where, ": token id must be an integer in [0, 2^31), got ", v.dump()));
  }

  static std::string TypeOf(const json& j) {
    if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
    return "";
  }

  absl::StatusOr<std::unique_ptr<Regex>> Pattern(const json& j, const std::string& where) const {
    if (!j.is_object()) return Error(absl::StrCat(where, ": pattern must be {\"String\": ...} or {\"Regex\": ...}"));
    absl::StatusOr<std::unique_ptr<Regex>> regex;
    if (j.contains("String")) {
      regex = Regex::Literal(j["String"].get<std::string>());
    } else if (j.contains("Regex")) {
      regex = Regex::Compile(j["Regex"].get<std::string>());
    } else {
      return Error(absl::StrCat(where, ": pattern must be {\"String\": ...} or {\"Regex\": ...}"));
    }
    if (!regex.ok()) return Error(absl::StrCat(where, ": ", regex.status().message()));
    return regex;
  }

  absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j) const {
    if (j.is_null()) return nullptr;
    const std::string type = TypeOf(j);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Normalizer>> steps;
      for (const json& step : j.at("normalizers")) {
        KVMESH_ASSIGN_OR_RETURN(auto n, ParseNormalizer(step));
        if (n != nullptr) steps.push_back(std::move(n));
      }
      return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
    }
    if (type == "Prepend") return std::unique_ptr<Normalizer>(new PrependNormalizer(j.at("prepend")));
    if (type == "Replace") {
      KVMESH_ASSIGN_OR_RETURN(auto pattern, Pattern(j.at("pattern"), "Replace normalizer"));
      return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), j.at("content")));
    }
    if (type == "Strip") {
      return std::unique_ptr<Normalizer>(new StripNormalizer(j.value("strip_left", true), j.value("strip_right", true)));
    }
    return Unsupported("normalizer", type);
  }

  absl::StatusOr<SplitBehavior> Behavior(const json& j) const {
    const std::string b = j.get<std::string>();
    if (b == "Removed") return SplitBehavior::kRemoved;
    if (b == "Isolated") return SplitBehavior::kIsolated;
    if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (b == "Contiguous") return SplitBehavior::kContiguous;
    return Error(absl::StrCat("unknown split behavior '", b, "'"));
  }

  absl::StatusOr<PrependScheme> Scheme(const json& j) const {
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") return PrependScheme::kAlways;
      if (s == "first") return PrependScheme::kFirst;
      if (s == "never") return PrependScheme::kNever;
      return Error(absl::StrCat("unknown Metaspace prepend_scheme '", s, "'"));
    }
    // Older files: add_prefix_space.
    return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }

  absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j) const {
    if (j.is_null()) return nullptr;
    const std::string type = TypeOf(j);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PreTokenizer>> steps;
      for (const json& step : j.at("pretokenizers")) {
        KVMESH_ASSIGN_OR_RETURN(auto p, ParsePreTokenizer(step));
        if (p != nullptr) steps.push_back(std::move(p));
      }
      return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
    }
    if (type == "ByteLevel") {
      return std::unique_ptr<PreTokenizer>(
          ByteLevelPreTokenizer::Create(j.value("add_prefix_space", true), j.value("use_regex", true)));
    }
    if (type == "Split") {
      KVMESH_ASSIGN_OR_RETURN(auto pattern, Pattern(j.at("pattern"), "Split pre-tokenizer"));
      KVMESH_ASSIGN_OR_RETURN(auto behavior, Behavior(j.at("behavior")));
      return std::unique_ptr<PreTokenizer>(
          new SplitPreTokenizer(std::move(pattern), behavior, j.value("invert", false)));
    }
    if (type == "Metaspace") {
      KVMESH_ASSIGN_OR_RETURN(auto scheme, Scheme(j));
      return std::unique_ptr<PreTokenizer>(
          new MetaspacePreTokenizer(j.value("replacement", std::string("\xE2\x96\x81")), scheme, j.value("split", true)));
    }
    if (type == "Digits") {
      return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(j.value("individual_digits", false)));
    }
    return Unsupported("pre_tokenizer", type);
  }

  absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j) const {
    if (j.is_null()) return nullptr;
    const std::string type = TypeOf(j);
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Decoder>> steps;
      for (const json& step : j.at("decoders")) {
        KVMESH_ASSIGN_OR_RETURN(auto d, ParseDecoder(step));
        if (d != nullptr) steps.push_back(std::move(d));
      }
      return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
    }
    if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
    if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
    if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
    if (type == "Metaspace") {
      KVMESH_ASSIGN_OR_RETURN(auto scheme, Scheme(j));
      return std::unique_ptr<Decoder>(new MetaspaceDecoder(j.value("replacement", std::string("\xE2\x96\x81")), scheme));
    }
    if (type == "Replace") {
      KVMESH_ASSIGN_OR_RETURN(auto pattern, Pattern(j.at("pattern"), "Replace decoder"));
      return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), j.at("content")));
    }
    if (type == "Strip") {
      const std::string content = j.at("content");
      return std::unique_ptr<Decoder>(new StripDecoder(content, j.value("start", 0), j.value("stop", 0)));
    }
    return Unsupported("decoder", type);
  }

  absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const json& j) const {
    if (j.is_null()) return nullptr;
    const std::string type = TypeOf(j);
    if (type == "ByteLevel") return nullptr;  // only trims offsets
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PostProcessor>> steps;
      for (const json& step : j.at("processors")) {
        KVMESH_ASSIGN_OR_RETURN(auto p, ParsePostProcessor(step));
        if (p != nullptr) steps.push_back(std::move(p));
      }
      return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(steps)));
    }
    if (type == "TemplateProcessing") {
      std::vector<int32_t> prefix, suffix;
      bool seen_sequence = false;
      const json& specials = j.at("special_tokens");
      for (const json& piece : j.at("single")) {
        if (piece.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        const std::string id = piece.at("SpecialToken").at("id");
        if (!specials.contains(id)) {
          return Error(absl::StrCat("TemplateProcessing names special token '", id, "' missing from special_tokens"));
        }
        for (const json& v : specials[id].at("ids")) {
          KVMESH_ASSIGN_OR_RETURN(const int32_t token, TokenId(v, "TemplateProcessing special_tokens"));
          (seen_sequence ? suffix : prefix).push_back(token);
        }
      }
      return std::unique_ptr<PostProcessor>(new WrapPostProcessor(std::move(prefix), std::move(suffix)));
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      KVMESH_ASSIGN_OR_RETURN(const int32_t cls, TokenId(j.at("cls").at(1), absl::StrCat(type, " cls")));
      KVMESH_ASSIGN_OR_RETURN(const int32_t sep, TokenId(j.at("sep").at(1), absl::StrCat(type, " sep")));
      return std::unique_ptr<PostProcessor>(new WrapPostProcessor({cls}, {sep}));
    }
    return Unsupported("post_processor", type);
  }

  absl::StatusOr<std::unique_ptr<BpeModel>> ParseModel(const json& j) const {
    if (!j.is_object()) return Error("missing \"model\"");
    std::string type = TypeOf(j);
    if (type.empty()) {
      // The original GPT-2 file has no type; `tokenizers` infers BPE from the merges.
      if (j.contains("merges")) type = "BPE";
    }
    if (type != "BPE") return Unsupported("model type", type.empty() ? "(none)" : type);
    if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() > 0.0) {
      return Error("BPE dropout is not supported (encode must be deterministic)");
    }
    const json& vocab_json = j.at("vocab");
    if (!vocab_json.is_object()) return Error("model.vocab must be an object of token -> id");
    absl::flat_hash_map<std::string, int32_t> vocab;
    vocab.reserve(vocab_json.size());
    for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
      KVMESH_ASSIGN_OR_RETURN(vocab[it.key()], TokenId(it.value(), absl::StrCat("model.vocab['", it.key(), "']")));
    }
    std::vector<std::pair<std::string, std::string>> merges;
    if (j.contains("merges")) {
      const json& merges_json = j["merges"];
      merges.reserve(merges_json.size());
      for (size_t i = 0; i < merges_json.size(); ++i) {
        const json& m = merges_json[i];
        if (m.is_string()) {
          const std::string s = m.get<std::string>();
          const size_t space = s.find(' ');
          if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
            return Error(absl::StrCat("merge ", i, " ('", s, "') is not two tokens separated by one space"));
          }
          merges.emplace_back(s.substr(0, space), s.substr(space + 1));
        } else if (m.is_array() && m.size() == 2) {
          merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
          return Error(absl::StrCat("merge ", i, " is neither \"a b\" nor [a, b]"));
        }
      }
    }
    BpeOptions options;
    if (j.contains("unk_token") && !j["unk_token"].is_null()) options.unk_token = j["unk_token"].get<std::string>();
    if (j.contains("continuing_subword_prefix") && !j["continuing_subword_prefix"].is_null()) {
      options.continuing_subword_prefix = j["continuing_subword_prefix"].get<std::string>();
    }
    if (j.contains("end_of_word_suffix") && !j["end_of_word_suffix"].is_null()) {
      options.end_of_word_suffix = j["end_of_word_suffix"].get<std::string>();
    }
    options.fuse_unk = j.value("fuse_unk", false);
    options.byte_fallback = j.value("byte_fallback", false);
    options.ignore_merges = j.value("ignore_merges", false);
    auto model = BpeModel::Create(std::move(vocab), merges, std::move(options));
    if (!model.ok()) return Error(std::string(model.status().message()));
    return model;
  }

  absl::StatusOr<std::unique_ptr<PipelineTokenizer>> Load(const json& root) const {
    if (!root.is_object()) return Error("not a JSON object");
    if (!root.contains("model")) return Error("missing \"model\"");
    PipelineParts parts;
    KVMESH_ASSIGN_OR_RETURN(parts.model, ParseModel(root["model"]));
    if (root.contains("normalizer")) {
      KVMESH_ASSIGN_OR_RETURN(parts.normalizer, ParseNormalizer(root["normalizer"]));
    }
    if (root.contains("pre_tokenizer")) {
      KVMESH_ASSIGN_OR_RETURN(parts.pre_tokenizer, ParsePreTokenizer(root["pre_tokenizer"]));
    }
    if (root.contains("post_processor")) {
      KVMESH_ASSIGN_OR_RETURN(parts.post_processor, ParsePostProcessor(root["post_processor"]));
    }
    if (root.contains("decoder")) {
      KVMESH_ASSIGN_OR_RETURN(parts.decoder, ParseDecoder(root["decoder"]));
    }
    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
      for (const json& t : root["added_tokens"]) {
        AddedToken token;
        KVMESH_ASSIGN_OR_RETURN(token.id, TokenId(t.at("id"), "added_tokens id"));
        token.content = t.at("content").get<std::string>();
        token.single_word = t.value("single_word", false);
        token.lstrip = t.value("lstrip", false);
        token.rstrip = t.value("rstrip", false);
        token.normalized = t.value("normalized", true);
        token.special = t.value("special", false);
        parts.added_tokens.push_back(std::move(token));
      }
      AssignAddedTokenIds(*parts.model, &parts.added_tokens);
    }
    return std::make_unique<PipelineTokenizer>(std::move(parts));
  }
};

// NOTE: `tokenizers` does not trust the ids written in added_tokens: it adds
// the tokens one by one, a token already in the model vocabulary keeps that id
// and a new one gets the next id after the model vocabulary / the last added
// id. Files it wrote itself agree with this; hand-edited ones may not, and then
// its ids (not the file's) are what models were trained with.
void AssignAddedTokenIds(const BpeModel& model, std::vector<AddedToken>* tokens) {
  const int32_t vocab_size = static_cast<int32_t>(model.vocab().size());
  absl::flat_hash_map<std::string, int32_t> assigned;
  std::optional<int32_t> max_added;
  for (AddedToken& token : *tokens) {
    if (auto it = assigned.find(token.content); it != assigned.end()) {
      token.id = it->second;
    } else if (auto id = model.TokenToId(token.content)) {
      token.id = *id;
    } else if (!max_added.has_value()) {
      token.id = vocab_size;
    } else {
      token.id = (*max_added >= vocab_size || vocab_size == 0) ? *max_added + 1 : vocab_size;
    }
    assigned.emplace(token.content, token.id);
    max_added = max_added.has_value() ? std::max(*max_added, token.id) : token.id;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineTokenizer>> LoadTokenizerJson(const std::string& json_text,
                                                                     const std::string& path) {
  Loader loader{path};
  // NOTE: nlohmann throws on malformed input and on type mismatches; nothing
  // may escape libs/, so every exception becomes an InvalidArgument here.
  try {
    const json root = json::parse(json_text);
    return loader.Load(root);
  } catch (const json::exception& e) {
    return loader.Error(absl::StrCat("malformed tokenizer.json: ", e.what()));
  }
}

}  // namespace kvmesh::model::internal
