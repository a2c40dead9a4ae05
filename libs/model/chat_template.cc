// Built-in chat templates, each a direct transcription of a published Jinja
// template (see tools/make-tokenizer-fixtures for the Jinja source and the
// expected renderings the tests compare against).
#include "model/chat_template.h"

#include <optional>

#include "model/gguf_file.h"
#include "model/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "model/internal/utf8.h"

namespace kvmesh::model {
namespace {

using json = nlohmann::json;

// Jinja's `trim` filter: Python's str.strip().
std::string PythonStrip(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end) {
    size_t p = begin;
    if (!internal::IsPythonSpace(internal::DecodeUtf8(s, &p))) break;
    begin = p;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t p = start;
    if (!internal::IsPythonSpace(internal::DecodeUtf8(s, &p))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

absl::Status CheckRoles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("chat template: no messages");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("chat template: unknown role '", m.role, "'"));
    }
  }
  return absl::OkStatus();
}

// Meta-Llama-3-8B-Instruct.
std::string RenderLlama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const std::string& bos_token) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos_token;
    absl::StrAppend(&out, "<|start_header_id|>", messages[i].role, "<|end_header_id|>\n\n",
                    PythonStrip(messages[i].content), "<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Qwen2-Instruct (ChatML with a default system prompt).
std::string RenderChatMl(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system") out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
    absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Mistral-7B-Instruct-v0.1. It has no generation prompt: "[/INST]" ends the prompt.
absl::StatusOr<std::string> RenderMistral(const std::vector<ChatMessage>& messages, const std::string& bos_token,
                                          const std::string& eos_token) {
  std::string out = bos_token;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0)) {
      return absl::InvalidArgumentError("chat template: Conversation roles must alternate user/assistant/user/assistant/...");
    }
    if (m.role == "user") {
      absl::StrAppend(&out, "[INST] ", m.content, " [/INST]");
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, m.content, eos_token);
    } else {
      return absl::InvalidArgumentError("chat template: Only user and assistant roles are supported!");
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(const std::string& name) {
  if (name == "llama3") return ChatTemplate(ChatTemplateKind::kLlama3);
  if (name == "chatml") return ChatTemplate(ChatTemplateKind::kChatMl);
  if (name == "mistral") return ChatTemplate(ChatTemplateKind::kMistral);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template '", name, "' (expected llama3, chatml or mistral)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(const std::string& jinja) {
  if (absl::StrContains(jinja, "<|start_header_id|>")) return ChatTemplate(ChatTemplateKind::kLlama3);
  if (absl::StrContains(jinja, "<|im_start|>")) return ChatTemplate(ChatTemplateKind::kChatMl);
  if (absl::StrContains(jinja, "[INST]")) return ChatTemplate(ChatTemplateKind::kMistral);
  return absl::InvalidArgumentError("chat_template matches none of llama3, chatml or mistral");
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDirectory(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) {
    KVMESH_ASSIGN_OR_RETURN(const std::optional<std::string> jinja, GgufChatTemplate(model_dir));
    if (!jinja) return absl::NotFoundError(absl::StrCat(model_dir, ": no tokenizer.chat_template"));
    return FromJinja(*jinja);
  }
  const std::string path = JoinPath(model_dir, "tokenizer_config.json");
  KVMESH_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string jinja;
  try {
    const json root = json::parse(text);
    if (!root.is_object() || !root.contains("chat_template")) {
      return absl::NotFoundError(absl::StrCat(path, ": no chat_template"));
    }
    const json& t = root["chat_template"];
    if (t.is_string()) {
      jinja = t.get<std::string>();
    } else if (t.is_array()) {
      // Named templates: [{"name": "default", "template": "..."}, ...].
      for (const json& entry : t) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template")) {
          jinja = entry["template"].get<std::string>();
        }
      }
      if (jinja.empty()) return absl::NotFoundError(absl::StrCat(path, ": no default chat_template"));
    } else {
      return absl::NotFoundError(absl::StrCat(path, ": chat_template is not a string"));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
  auto result = FromJinja(jinja);
  if (!result.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", result.status().message()));
  return result;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                const std::string& bos_token) const {
  return Apply(messages, add_generation_prompt, bos_token, "</s>");
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                const std::string& bos_token, const std::string& eos_token) const {
  KVMESH_RETURN_IF_ERROR(CheckRoles(messages));
  switch (kind_) {
    case ChatTemplateKind::kLlama3:
      return RenderLlama3(messages, add_generation_prompt, bos_token);
    case ChatTemplateKind::kChatMl:
      return RenderChatMl(messages, add_generation_prompt);
    case ChatTemplateKind::kMistral:
      return RenderMistral(messages, bos_token, eos_token);
  }
  return absl::InternalError("unknown chat template kind");
}

}  // namespace kvmesh::model
