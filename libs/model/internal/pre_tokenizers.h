// Pre-tokenizers of the `tokenizers` pipeline: they cut normalized text into
// words for the model. Supported: ByteLevel, Split (String/Regex pattern, all
// five behaviors, invert), Metaspace, Digits and Sequence.
//
// Thread-safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/internal/regex.h"

namespace kvmesh::model::internal {

struct PreToken {
  std::string text;
  bool at_origin;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces; empty pieces are dropped.
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2 style: optional prefix space, optional GPT-2 regex split, then each byte
// becomes its printable stand-in character.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  static std::unique_ptr<ByteLevelPreTokenizer> Create(bool add_prefix_space, bool use_regex);
  void PreTokenize(std::vector<PreToken>* pieces) const override;

 private:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits);
  void PreTokenize(std::vector<PreToken>* pieces) const override;

 private:
  bool individual_digits_;
  std::unique_ptr<Regex> digit_;
};

// Cuts `piece` at `matches` (sorted, non-overlapping [begin, end)) following
// `behavior`, as NormalizedString::split does; appends non-empty results.
void SplitPiece(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                SplitBehavior behavior, bool invert, std::vector<PreToken>* out);

}  // namespace kvmesh::model::internal
