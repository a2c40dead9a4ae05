// ChatTemplate: turns a conversation into the prompt text a model was trained
// on by running the model's own Jinja chat template (tokenizer_config.json's
// `chat_template`, a GGUF's `tokenizer.chat_template`, or a file named by
// --chat-template) through kvmesh's jinja2 interpreter (model/jinja/), with
// the environment transformers' apply_chat_template gives it: trim_blocks,
// lstrip_blocks, loop controls, its `tojson`, `raise_exception(msg)`,
// `strftime_now(fmt)`, and the variables messages, tools, documents,
// add_generation_prompt, bos_token, eos_token plus any extra ones.
//
// The template is compiled once, when the ChatTemplate is made: a syntax error
// or a construct outside the supported subset fails there, naming its line.
//
// Thread-safety: immutable after creation; Render/Apply may run concurrently.
// Copies are cheap (they share the compiled templates).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/jinja/template.h"

namespace kvmesh::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
};

// The special tokens a template may write (`bos_token`, `eos_token`).
struct ChatTemplateTokens {
  std::string bos;
  std::string eos;
};

struct ChatTemplateInputs {
  // [{"role": ..., "content": ..., "tool_calls": [...], ...}, ...], passed to the
  // template as is (ordered_json keeps key order, which `tojson` shows).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // OpenAI-style tool schemas; null when the request has none (the template sees None).
  nlohmann::ordered_json tools = nullptr;
  bool add_generation_prompt = true;
  // Further variables (documents, date_string, tools_in_user_message, ...); they
  // override the defaults above of the same name.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // Overrides the template's bos_token / eos_token when set.
  std::optional<ChatTemplateTokens> tokens;
  // What strftime_now() formats (local time); now when unset.
  std::optional<absl::Time> now;
};

class ChatTemplate {
 public:
  // Compiles one Jinja template. InvalidArgument "chat template line N: ..."
  // for a syntax error or an unsupported construct.
  static absl::StatusOr<ChatTemplate> FromJinja(const std::string& source, const ChatTemplateTokens& tokens = {});
  // Named templates, as tokenizer_config.json's list form holds them: Render
  // uses "tool_use" when tools are given and it exists, else "default".
  // InvalidArgument when there is no "default" (or any template fails to compile).
  static absl::StatusOr<ChatTemplate> FromNamedJinja(const std::map<std::string, std::string>& sources,
                                                     const ChatTemplateTokens& tokens = {});
  // A Jinja file (--chat-template FILE). NotFound if it cannot be read.
  static absl::StatusOr<ChatTemplate> FromFile(const std::string& path, const ChatTemplateTokens& tokens = {});
  // Built-in templates by name: "llama3", "chatml", "mistral" (the published
  // Jinja of Llama 3, Qwen2 and Mistral-7B-Instruct-v0.1). InvalidArgument otherwise.
  static absl::StatusOr<ChatTemplate> FromName(const std::string& name);
  // `model_dir`/chat_template.jinja if present, else tokenizer_config.json's
  // `chat_template` (a string or a list of {"name", "template"}), with its
  // bos_token/eos_token. NotFound if it has none; InvalidArgument if it does
  // not compile.
  static absl::StatusOr<ChatTemplate> FromModelDirectory(const std::string& model_dir);
  // What a server uses for `model_dir`: `override_template` when not empty
  // (--chat-template: a Jinja file, or a built-in name), written with the
  // model's bos/eos tokens; otherwise FromModelDirectory.
  static absl::StatusOr<ChatTemplate> ForModel(const std::string& model_dir, const std::string& override_template);

  // The rendered prompt, exactly as transformers' apply_chat_template(tokenize=False).
  // InvalidArgument for a render error; raise_exception's message is kept in it.
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  // Plain-text conversations. The template's own tokens are used unless given here.
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                    const std::string& bos_token) const;
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                    const std::string& bos_token, const std::string& eos_token) const;

  const ChatTemplateTokens& tokens() const { return tokens_; }
  bool has_tool_use_template() const { return tool_use_.has_value(); }

 private:
  ChatTemplate(jinja::Template default_template, std::optional<jinja::Template> tool_use, ChatTemplateTokens tokens)
      : default_(std::move(default_template)), tool_use_(std::move(tool_use)), tokens_(std::move(tokens)) {}

  jinja::Template default_;
  std::optional<jinja::Template> tool_use_;
  ChatTemplateTokens tokens_;
};

// A JSON value as a template value (objects keep their key order).
jinja::Value JsonToValue(const nlohmann::ordered_json& j);

}  // namespace kvmesh::model
