#include "model/chat_template.h"

#include <ctime>
#include <optional>

#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "model/jinja/python_format.h"

namespace kvmesh::model {
namespace {

using json = nlohmann::ordered_json;

// The published Jinja of the three families kvmesh used to hard-code.
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr char kMistralTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

// tokenizer_config.json writes a special token as "text" or {"content": "text", ...}.
std::string TokenText(const json& root, const char* key) {
  if (!root.contains(key)) return "";
  const json& t = root[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

jinja::Value StrftimeNow(absl::Time now, jinja::CallArgs& args, absl::Status* error) {
  if (args.positional.size() != 1 || !args.positional[0].is_string()) {
    *error = absl::InvalidArgumentError("strftime_now() takes one format string");
    return {};
  }
  const time_t t = absl::ToTimeT(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), args.positional[0].as_string().c_str(), &tm);
  return jinja::Value::String(std::string(buf, n));
}

}  // namespace

jinja::Value JsonToValue(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return jinja::Value::None();
    case json::value_t::boolean:
      return jinja::Value::Bool(j.get<bool>());
    case json::value_t::number_integer:
      return jinja::Value::Int(j.get<int64_t>());
    case json::value_t::number_unsigned:
      return jinja::Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case json::value_t::number_float:
      return jinja::Value::Float(j.get<double>());
    case json::value_t::string:
      return jinja::Value::String(j.get<std::string>());
    case json::value_t::array: {
      std::vector<jinja::Value> items;
      for (const json& e : j) items.push_back(JsonToValue(e));
      return jinja::Value::List(std::move(items));
    }
    case json::value_t::object: {
      jinja::Value d = jinja::Value::Dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict().Set(it.key(), JsonToValue(it.value()));
      return d;
    }
    default:
      return jinja::Value::None();
  }
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(const std::string& source, const ChatTemplateTokens& tokens) {
  KVMESH_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source));
  return ChatTemplate(std::move(t), std::nullopt, tokens);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromNamedJinja(const std::map<std::string, std::string>& sources,
                                                          const ChatTemplateTokens& tokens) {
  auto d = sources.find("default");
  if (d == sources.end()) return absl::InvalidArgumentError("named chat templates have no \"default\"");
  absl::StatusOr<jinja::Template> def = jinja::Template::Parse(d->second);
  if (!def.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template \"default\": ", def.status().message()));
  std::optional<jinja::Template> tool_use;
  if (auto t = sources.find("tool_use"); t != sources.end()) {
    absl::StatusOr<jinja::Template> tu = jinja::Template::Parse(t->second);
    if (!tu.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template \"tool_use\": ", tu.status().message()));
    tool_use = std::move(*tu);
  }
  return ChatTemplate(std::move(*def), std::move(tool_use), tokens);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromFile(const std::string& path, const ChatTemplateTokens& tokens) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("--chat-template ", path, ": ", text.status().message()));
  absl::StatusOr<ChatTemplate> t = FromJinja(*text, tokens);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(const std::string& name) {
  if (name == "llama3") return FromJinja(kLlama3Template, {"<|begin_of_text|>", "<|eot_id|>"});
  if (name == "chatml") return FromJinja(kChatMlTemplate, {"", "<|im_end|>"});
  if (name == "mistral") return FromJinja(kMistralTemplate, {"<s>", "</s>"});
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template '", name, "' (expected llama3, chatml or mistral, or a Jinja file)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDirectory(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) {
    KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> jinja, GgufChatTemplate(model_dir));
    if (!jinja) return absl::NotFoundError(absl::StrCat(model_dir, ": no tokenizer.chat_template"));
    return FromJinja(*jinja);
  }
  const std::string path = JoinPath(model_dir, "tokenizer_config.json");
  ChatTemplateTokens tokens;
  json root = json::object();
  if (FileExists(path)) {
    KVMESH_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    root = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON"));
    tokens = {TokenText(root, "bos_token"), TokenText(root, "eos_token")};
  }
  // Newer transformers save the template beside the config as chat_template.jinja.
  const std::string jinja_path = JoinPath(model_dir, "chat_template.jinja");
  if (FileExists(jinja_path)) return FromFile(jinja_path, tokens);
  if (!root.contains("chat_template")) return absl::NotFoundError(absl::StrCat(path, ": no chat_template"));
  const json& t = root["chat_template"];
  absl::StatusOr<ChatTemplate> result = absl::NotFoundError(absl::StrCat(path, ": chat_template is not a string"));
  if (t.is_string()) {
    result = FromJinja(t.get<std::string>(), tokens);
  } else if (t.is_array()) {
    // Named templates: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}].
    std::map<std::string, std::string> named;
    for (const json& entry : t) {
      if (entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("template") &&
          entry["template"].is_string()) {
        named[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
      }
    }
    if (named.find("default") == named.end()) return absl::NotFoundError(absl::StrCat(path, ": no default chat_template"));
    result = FromNamedJinja(named, tokens);
  }
  if (!result.ok() && result.status().code() == absl::StatusCode::kInvalidArgument) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", result.status().message()));
  }
  return result;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForModel(const std::string& model_dir,
                                                    const std::string& override_template) {
  if (override_template.empty()) return FromModelDirectory(model_dir);
  if (!FileExists(override_template)) {
    absl::StatusOr<ChatTemplate> builtin = FromName(override_template);
    if (builtin.ok()) return builtin;
    return absl::NotFoundError(absl::StrCat("--chat-template ", override_template,
                                            ": no such file (nor a built-in llama3, chatml or mistral)"));
  }
  ChatTemplateTokens tokens;
  const std::string config = JoinPath(model_dir, "tokenizer_config.json");
  if (FileExists(config)) {
    if (absl::StatusOr<std::string> text = ReadFileToString(config); text.ok()) {
      const json root = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (root.is_object()) tokens = {TokenText(root, "bos_token"), TokenText(root, "eos_token")};
    }
  }
  return FromFile(override_template, tokens);
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  const ChatTemplateTokens& tokens = inputs.tokens ? *inputs.tokens : tokens_;
  const absl::Time now = inputs.now.value_or(absl::Now());
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.emplace_back("messages", JsonToValue(inputs.messages));
  vars.emplace_back("tools", JsonToValue(inputs.tools));
  vars.emplace_back("documents", jinja::Value::None());
  vars.emplace_back("add_generation_prompt", jinja::Value::Bool(inputs.add_generation_prompt));
  vars.emplace_back("bos_token", jinja::Value::String(tokens.bos));
  vars.emplace_back("eos_token", jinja::Value::String(tokens.eos));
  vars.emplace_back("raise_exception", jinja::Value::Func("raise_exception", [](jinja::CallArgs& args)
                                                               -> absl::StatusOr<jinja::Value> {
    const std::string msg = args.positional.empty() ? "" : jinja::ToStr(args.positional[0]);
    return absl::InvalidArgumentError(absl::StrCat("raise_exception: ", msg));
  }));
  vars.emplace_back("strftime_now", jinja::Value::Func("strftime_now", [now](jinja::CallArgs& args)
                                                            -> absl::StatusOr<jinja::Value> {
    absl::Status error;
    jinja::Value v = StrftimeNow(now, args, &error);
    if (!error.ok()) return error;
    return v;
  }));
  if (inputs.extra.is_object()) {
    for (auto it = inputs.extra.begin(); it != inputs.extra.end(); ++it) {
      bool replaced = false;
      for (auto& [k, v] : vars) {
        if (k == it.key()) {
          v = JsonToValue(it.value());
          replaced = true;
        }
      }
      if (!replaced) vars.emplace_back(it.key(), JsonToValue(it.value()));
    }
  }
  const jinja::Template& t = (!inputs.tools.is_null() && tool_use_) ? *tool_use_ : default_;
  return t.Render(vars);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt) const {
  return Apply(messages, add_generation_prompt, tokens_.bos, tokens_.eos);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                const std::string& bos_token) const {
  return Apply(messages, add_generation_prompt, bos_token, tokens_.eos);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                const std::string& bos_token, const std::string& eos_token) const {
  ChatTemplateInputs inputs;
  for (const ChatMessage& m : messages) inputs.messages.push_back({{"role", m.role}, {"content", m.content}});
  inputs.add_generation_prompt = add_generation_prompt;
  inputs.tokens = ChatTemplateTokens{bos_token, eos_token};
  return Render(inputs);
}

}  // namespace kvmesh::model
