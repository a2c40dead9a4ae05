// AddedVocabulary: the added/special tokens of a tokenizer and how `tokenizers`
// cuts them out of the input before the model sees it. Matching is
// leftmost-longest over all contents (as its Aho-Corasick automaton does), then
// single_word / lstrip / rstrip are applied per match.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace kvmesh::model::internal {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A cut of the input: either a run of plain text or one added token.
struct TextSplit {
  size_t begin;
  size_t end;
  int32_t token_id;  // -1 for plain text
};

// Leftmost-longest multi-pattern matcher over a byte trie.
class TokenMatcher {
 public:
  // `patterns[i]` is reported as pattern index i. Empty patterns are ignored.
  explicit TokenMatcher(const std::vector<std::string>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  // Finds the leftmost-longest match starting at or after `from`; false if none.
  bool FindNext(std::string_view text, size_t from, size_t* begin, size_t* end, int32_t* pattern) const;

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> children;
    int32_t pattern = -1;
  };
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  // `normalize` is applied to the content of normalized tokens before matching
  // (tokens are matched in normalized text); may be empty.
  AddedVocabulary(std::vector<AddedToken> tokens, const std::function<std::string(std::string_view)>& normalize);

  // Splits `text` on the tokens of one kind (normalized or not).
  void Split(std::string_view text, bool normalized_kind, std::vector<TextSplit>* out) const;
  bool has_tokens(bool normalized_kind) const {
    return normalized_kind ? !normalized_matcher_->empty() : !raw_matcher_->empty();
  }

  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  std::unique_ptr<TokenMatcher> raw_matcher_;
  std::vector<size_t> raw_index_;  // matcher pattern -> tokens_ index
  std::unique_ptr<TokenMatcher> normalized_matcher_;
  std::vector<size_t> normalized_index_;
};

}  // namespace kvmesh::model::internal
