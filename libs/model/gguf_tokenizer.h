// The tokenizer and chat template a GGUF file carries in its tokenizer.*
// metadata, as the same Tokenizer objects tokenizer.json / tokenizer.model
// produce.
//
//   tokenizer.ggml.model "gpt2": byte-level BPE over tokenizer.ggml.tokens and
//     .merges, with the pre-tokenizer tokenizer.ggml.pre names (llama.cpp's
//     names: default/gpt2, smollm/starcoder/refact, llama3/llama-bpe, qwen2)
//     built as the Hugging Face tokenizer.json of that family writes it.
//   tokenizer.ggml.model "llama": SentencePiece-style BPE from the tokens,
//     scores and token types (byte fallback, dummy prefix per add_space_prefix).
// Control tokens (token_type 3) are special added tokens, user-defined ones (4)
// plain added tokens. BOS/EOS from bos_token_id / eos_token_id; the
// post-processor prepends BOS / appends EOS per add_bos_token / add_eos_token.
//
// Thread-safety: pure functions; the tokenizer returned is immutable.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"

namespace kvmesh::model {

// InvalidArgument naming the file and the key for a missing or inconsistent key,
// an unknown tokenizer model or pre-tokenizer.
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& file);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path);

// The tokenizer.json text TokenizerFromGguf builds for a "gpt2" model (the
// same one it loads): for export and for tests against `tokenizers`.
absl::StatusOr<std::string> GgufTokenizerJson(const GgufFile& file);

// tokenizer.chat_template (the Jinja source), or nullopt if the file has none.
absl::StatusOr<std::optional<std::string>> GgufChatTemplate(const std::string& path);

}  // namespace kvmesh::model
