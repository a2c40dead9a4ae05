#include "model/internal/added_vocabulary.h"

#include "model/internal/regex.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Rust regex's Unicode \w, approximated by PCRE2's (letters, numbers, marks, '_').
bool IsWordChar(char32_t cp) {
  if (cp < 128) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  static const Regex* word = Regex::Compile("^[\\p{L}\\p{N}\\p{M}\\p{Pc}]$").value().release();
  std::string s;
  AppendUtf8(cp, &s);
  std::vector<std::pair<size_t, size_t>> m;
  word->FindAll(s, &m);
  return !m.empty();
}

char32_t LastChar(std::string_view s) {
  size_t pos = s.size() - 1;
  while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return DecodeUtf8(s, &pos);
}

char32_t FirstChar(std::string_view s) {
  size_t pos = 0;
  return DecodeUtf8(s, &pos);
}

// Start of the run of whitespace that ends `s`.
size_t LeftmostSpaceAtEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t pos = end - 1;
    while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
    size_t p = pos;
    if (!IsUnicodeWhitespace(DecodeUtf8(s, &p))) break;
    end = pos;
  }
  return end;
}

// Length of the run of whitespace that starts `s`.
size_t RightmostSpaceAtStart(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t p = pos;
    if (!IsUnicodeWhitespace(DecodeUtf8(s, &p))) break;
    pos = p;
  }
  return pos;
}

}  // namespace

TokenMatcher::TokenMatcher(const std::vector<std::string>& patterns) {
  nodes_.emplace_back();
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (char c : p) {
      const unsigned char b = static_cast<unsigned char>(c);
      auto it = nodes_[node].children.find(b);
      if (it == nodes_[node].children.end()) {
        const int32_t next = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace(b, next);
        nodes_.emplace_back();
        node = next;
      } else {
        node = it->second;
      }
    }
    // NOTE: with duplicate contents the first pattern wins, as in Aho-Corasick.
    if (nodes_[node].pattern < 0) nodes_[node].pattern = static_cast<int32_t>(i);
  }
}

bool TokenMatcher::FindNext(std::string_view text, size_t from, size_t* begin, size_t* end, int32_t* pattern) const {
  if (empty()) return false;
  for (size_t start = from; start < text.size(); ++start) {
    if (!first_byte_[static_cast<unsigned char>(text[start])]) continue;
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t i = start; i < text.size(); ++i) {
      auto it = nodes_[node].children.find(static_cast<unsigned char>(text[i]));
      if (it == nodes_[node].children.end()) break;
      node = it->second;
      if (nodes_[node].pattern >= 0) {
        best = nodes_[node].pattern;
        best_end = i + 1;
      }
    }
    if (best >= 0) {
      *begin = start;
      *end = best_end;
      *pattern = best;
      return true;
    }
  }
  return false;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens,
                                 const std::function<std::string(std::string_view)>& normalize)
    : tokens_(std::move(tokens)) {
  std::vector<std::string> raw_patterns;
  std::vector<std::string> normalized_patterns;
  // `tokenizers` lists special tokens before the other added tokens.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const AddedToken& t = tokens_[i];
      if (t.special != (pass == 0)) continue;
      if (t.normalized) {
        normalized_patterns.push_back(normalize ? normalize(t.content) : t.content);
        normalized_index_.push_back(i);
      } else {
        raw_patterns.push_back(t.content);
        raw_index_.push_back(i);
      }
    }
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_id_[tokens_[i].id] = i;
    by_content_.emplace(tokens_[i].content, i);
  }
  raw_matcher_ = std::make_unique<TokenMatcher>(raw_patterns);
  normalized_matcher_ = std::make_unique<TokenMatcher>(normalized_patterns);
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(Sv(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocabulary::Split(std::string_view text, bool normalized_kind, std::vector<TextSplit>* out) const {
  const TokenMatcher& matcher = normalized_kind ? *normalized_matcher_ : *raw_matcher_;
  const std::vector<size_t>& index = normalized_kind ? normalized_index_ : raw_index_;
  size_t start_offset = 0;
  size_t search = 0;
  size_t begin = 0, end = 0;
  int32_t pattern = -1;
  while (search < text.size() && matcher.FindNext(text, search, &begin, &end, &pattern)) {
    search = end;
    const AddedToken& token = tokens_[index[pattern]];
    size_t start = begin;
    size_t stop = end;
    if (token.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastChar(text.substr(0, start)));
      const bool stop_space = stop == text.size() || !IsWordChar(FirstChar(text.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(LeftmostSpaceAtEnd(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += RightmostSpaceAtStart(text.substr(stop));
    if (start_offset < start) out->push_back(TextSplit{start_offset, start, -1});
    out->push_back(TextSplit{start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back(TextSplit{start_offset, text.size(), -1});
}

}  // namespace kvmesh::model::internal
