// Normalizers of the `tokenizers` pipeline, applied to each piece of input text
// between added tokens. Supported: Sequence, Prepend, Replace (String or Regex
// pattern), Strip, and SentencePiece's whitespace cleanup (for tokenizer.model).
//
// Thread-safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/internal/regex.h"

namespace kvmesh::model::internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Prepends `prefix` to non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) *text = prefix_ + *text;
  }

 private:
  std::string prefix_;
};

// Replaces every non-overlapping match of `pattern` with `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// Removes leading and/or trailing Unicode whitespace.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override;

 private:
  bool left_;
  bool right_;
};

// SentencePiece's remove_extra_whitespaces: drops leading and trailing ' ' and
// collapses runs of ' ' into one.
class CollapseSpacesNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override;
};

// Replaces each occurrence of the literal `from` with `to` (fast path for the
// common " " -> "▁").
void ReplaceAll(std::string_view from, std::string_view to, std::string* text);

}  // namespace kvmesh::model::internal
