// Tokenizer: text <-> token ids, compatible with Hugging Face `tokenizers`.
//
// Loads `tokenizer.json` (BPE models: byte-level as in GPT-2/Llama 3/Qwen2, and
// SentencePiece-style with Metaspace + byte fallback as in Llama 2/Mistral;
// normalizers, pre-tokenizers, post-processors, added/special tokens, decoders),
// or a bare SentencePiece `tokenizer.model` read with kvmesh's own description of
// its protobuf schema. Encode() must give the ids `tokenizers` gives.
//
// Thread-safety: immutable after loading; Encode/Decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Parses tokenizer.json text; `path` names the file in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& json_text,
                                                              const std::string& path);
  // Reads a bare SentencePiece model (tokenizer.model, protobuf bytes).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSentencePieceModel(const std::string& bytes,
                                                                          const std::string& path);
  // A model directory: tokenizer.json if present, else tokenizer.model; reads
  // tokenizer_config.json (when present) for bos/eos and add_bos_token.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& model_dir);

  // Ids for `text`. add_special_tokens applies the post-processor (e.g. BOS), as
  // `tokenizers`' encode(text, add_special_tokens=...). Special/added tokens that
  // appear in the text are matched as tokens. Invalid UTF-8 is handled as
  // `tokenizers` handles it after Python's lossy decode: each bad byte is U+FFFD.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;

  // Text for `ids`, as `tokenizers`' decode(ids, skip_special_tokens=...).
  // Ids out of range are skipped.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // Number of ids the tokenizer can produce (model vocab + added tokens).
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // The token's vocabulary string ("Ġhello", "▁the", "<0x0A>"); empty if out of range.
  virtual std::string IdToToken(int32_t id) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;

  // From tokenizer_config.json / the post-processor when known.
  virtual std::optional<int32_t> bos_token_id() const = 0;
  virtual std::optional<int32_t> eos_token_id() const = 0;
};

// IncrementalDetokenizer turns a growing list of ids into text pieces, never
// emitting part of a UTF-8 character or text that a later token would change
// (e.g. a SentencePiece leading space). The concatenation of everything Append()
// and Flush() return equals tokenizer.Decode(all ids).
//
// Thread-safety: not thread-safe; one per sequence. The tokenizer must outlive it.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Adds one id; returns the text that is now final (possibly empty).
  std::string Append(int32_t id);
  // Returns whatever is left (incomplete UTF-8 becomes U+FFFD, as Decode does).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_..read_offset_) give context
  size_t read_offset_ = 0;    // ids_[read_offset_..) not yet emitted
  size_t emitted_bytes_ = 0;
};

}  // namespace kvmesh::model
