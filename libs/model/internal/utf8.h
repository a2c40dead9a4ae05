// UTF-8 helpers shared by the tokenizer pipeline: lossy repair of invalid input
// (as Python's bytes.decode('utf-8', errors='replace') and Rust's
// String::from_utf8_lossy do it: one U+FFFD per maximal invalid subpart), code
// point iteration and encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvmesh::model::internal {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Length of the well-formed UTF-8 sequence at s[pos], or 0 when the bytes there
// do not start one. `*invalid_len` (when not null) receives the length of the
// maximal invalid subpart (>= 1) in that case.
size_t ValidSequenceLength(std::string_view s, size_t pos, size_t* invalid_len = nullptr);

bool IsValidUtf8(std::string_view s);

// `s` with every maximal invalid subpart replaced by U+FFFD.
std::string ToValidUtf8(std::string_view s);

// Decodes the code point at s[*pos] and advances *pos; an invalid or truncated
// sequence decodes as U+FFFD and advances past its maximal invalid subpart.
char32_t DecodeUtf8(std::string_view s, size_t* pos);

// Length in bytes of the UTF-8 sequence whose lead byte is `lead` (valid input).
inline size_t Utf8LeadLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void AppendUtf8(char32_t cp, std::string* out);

// Python's str.isspace() (used by Jinja's trim and tokenizers' Strip normalizer
// approximations): Unicode White_Space plus U+001C..U+001F.
bool IsPythonSpace(char32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s accept).
bool IsUnicodeWhitespace(char32_t cp);

}  // namespace kvmesh::model::internal
