// Regex: a PCRE2 (JIT) pattern with the matching rules of the Oniguruma regexes
// `tokenizers` uses: UTF-8 + Unicode properties, and `\s` is Unicode White_Space
// (PCRE2's \s omits U+0085, so it is rewritten).
//
// Thread-safety: immutable after Compile; FindAll may run on many threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model::internal {

class Regex {
 public:
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // InvalidArgument with PCRE2's message when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern matching `literal` exactly.
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view literal);

  // Appends every non-overlapping match in `text` (valid UTF-8, unchecked) as
  // [begin, end) byte offsets, leftmost first; an empty match advances one character.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // Onig-compatible rewrite of `\s`/`\S` (exposed for tests).
  static std::string TranslatePattern(std::string_view pattern);

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code*
};

}  // namespace kvmesh::model::internal
