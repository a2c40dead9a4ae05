// Chat templates: turn a list of messages into the prompt text a model was
// trained on. Built in: llama3, chatml (Qwen2) and mistral ([INST]); the kind
// is picked from tokenizer_config.json's `chat_template` string or named by flag.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model {

enum class ChatTemplateKind { kLlama3, kChatMl, kMistral };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // "llama3", "chatml", "mistral"; InvalidArgument otherwise.
  static absl::StatusOr<ChatTemplate> FromName(const std::string& name);
  // Recognises the kind from a Jinja chat_template string by its markers
  // (<|start_header_id|>, <|im_start|>, [INST]); InvalidArgument if none match.
  static absl::StatusOr<ChatTemplate> FromJinja(const std::string& jinja);
  // Reads tokenizer_config.json in `model_dir`; NotFound if it has no chat_template.
  static absl::StatusOr<ChatTemplate> FromModelDirectory(const std::string& model_dir);

  ChatTemplateKind kind() const { return kind_; }
  // The rendered prompt, including the BOS text the template itself writes
  // (`bos_token`), exactly as transformers' apply_chat_template(tokenize=False).
  // InvalidArgument on an unknown role, an empty list, or roles in an order the
  // template rejects (mistral: user/assistant must alternate).
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                    const std::string& bos_token) const;
  // As above with the `eos_token` the template writes after assistant turns
  // (mistral only; the three-argument form uses "</s>").
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                    const std::string& bos_token, const std::string& eos_token) const;

 private:
  explicit ChatTemplate(ChatTemplateKind kind) : kind_(kind) {}
  ChatTemplateKind kind_;
};

}  // namespace kvmesh::model
