#include "model/internal/pre_tokenizers.h"

#include <algorithm>

#include "model/internal/byte_level.h"
#include "model/internal/normalizers.h"

namespace kvmesh::model::internal {
namespace {

// The GPT-2 pre-tokenizer regex used by ByteLevel(use_regex=true).
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin;
  size_t end;
  bool flag;  // is_match, then (after the behavior) "remove"
};

}  // namespace

void SplitPiece(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                SplitBehavior behavior, bool invert, std::vector<PreToken>* out) {
  const std::string& text = piece.text;
  // 1. Cover the text with (offsets, is_match) spans.
  std::vector<Span> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (const auto& [begin, end] : matches) {
      if (prev != begin) spans.push_back({prev, begin, invert});
      spans.push_back({begin, end, !invert});
      prev = end;
    }
    if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  }
  // 2. Group them as the behavior says; `flag` becomes "remove".
  std::vector<Span> splits;
  splits.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) splits.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      splits = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.flag == previous_match && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.flag && !previous_match && !splits.empty()) {
          splits.back().end = s.end;
        } else {
          splits.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  // 3. Emit the kept, non-empty pieces.
  for (const Span& s : splits) {
    if (s.flag || s.end == s.begin) continue;
    out->push_back(PreToken{text.substr(s.begin, s.end - s.begin), piece.at_origin && s.begin == 0});
  }
}

void SplitPreTokenizer::PreTokenize(std::vector<PreToken>* pieces) const {
  std::vector<PreToken> out;
  out.reserve(pieces->size() * 4);
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreToken& piece : *pieces) {
    matches.clear();
    pattern_->FindAll(piece.text, &matches);
    SplitPiece(piece, matches, behavior_, invert_, &out);
  }
  *pieces = std::move(out);
}

std::unique_ptr<ByteLevelPreTokenizer> ByteLevelPreTokenizer::Create(bool add_prefix_space, bool use_regex) {
  std::unique_ptr<Regex> regex;
  if (use_regex) regex = Regex::Compile(kGpt2Pattern).value();  // a constant pattern: cannot fail
  return std::unique_ptr<ByteLevelPreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
}

void ByteLevelPreTokenizer::PreTokenize(std::vector<PreToken>* pieces) const {
  std::vector<PreToken> split;
  split.reserve(pieces->size() * 4);
  std::vector<std::pair<size_t, size_t>> matches;
  for (PreToken& piece : *pieces) {
    if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) piece.text = " " + piece.text;
    if (regex_ == nullptr) {
      if (!piece.text.empty()) split.push_back(std::move(piece));
      continue;
    }
    matches.clear();
    regex_->FindAll(piece.text, &matches);
    SplitPiece(piece, matches, SplitBehavior::kIsolated, /*invert=*/false, &split);
  }
  for (PreToken& piece : split) {
    std::string mapped;
    mapped.reserve(piece.text.size() * 2);
    BytesToChars(piece.text, &mapped);
    piece.text = std::move(mapped);
  }
  *pieces = std::move(split);
}

void MetaspacePreTokenizer::PreTokenize(std::vector<PreToken>* pieces) const {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  std::vector<std::pair<size_t, size_t>> matches;
  for (PreToken& piece : *pieces) {
    ReplaceAll(" ", replacement_, &piece.text);
    const bool starts_with_replacement = piece.text.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts_with_replacement &&
        (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
      piece.text = replacement_ + piece.text;
    }
    if (!split_) {
      if (!piece.text.empty()) out.push_back(std::move(piece));
      continue;
    }
    matches.clear();
    for (size_t pos = piece.text.find(replacement_); pos != std::string::npos;
         pos = piece.text.find(replacement_, pos + replacement_.size())) {
      matches.emplace_back(pos, pos + replacement_.size());
    }
    SplitPiece(piece, matches, SplitBehavior::kMergedWithNext, /*invert=*/false, &out);
  }
  *pieces = std::move(out);
}

DigitsPreTokenizer::DigitsPreTokenizer(bool individual_digits)
    : individual_digits_(individual_digits), digit_(Regex::Compile("\\p{N}").value()) {}

void DigitsPreTokenizer::PreTokenize(std::vector<PreToken>* pieces) const {
  std::vector<PreToken> out;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreToken& piece : *pieces) {
    matches.clear();
    digit_->FindAll(piece.text, &matches);
    SplitPiece(piece, matches, individual_digits_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
               /*invert=*/false, &out);
  }
  *pieces = std::move(out);
}

}  // namespace kvmesh::model::internal
