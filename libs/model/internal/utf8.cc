#include "model/internal/utf8.h"

namespace kvmesh::model::internal {

size_t ValidSequenceLength(std::string_view s, size_t pos, size_t* invalid_len) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    if (invalid_len != nullptr) *invalid_len = 1;
    return 0;
  }
  size_t i = 1;
  for (; i <= need; ++i) {
    if (pos + i >= s.size()) break;
    const unsigned char b = byte(pos + i);
    const unsigned char l = i == 1 ? lo : 0x80;
    const unsigned char h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (i == need + 1) return need + 1;
  if (invalid_len != nullptr) *invalid_len = i;
  return 0;
}

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t chunk = 0;
      for (int k = 0; k < 8; ++k) chunk |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + k])) << (8 * k);
      if (chunk & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    const size_t n = ValidSequenceLength(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t bad = 0;
    const size_t n = ValidSequenceLength(s, pos, &bad);
    if (n > 0) {
      out.append(s.data() + pos, n);
      pos += n;
    } else {
      out.append(kReplacementUtf8);
      pos += bad;
    }
  }
  return out;
}

char32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(s[i])); };
  const size_t p = *pos;
  const char32_t b0 = byte(p);
  if (b0 < 0x80) {
    *pos = p + 1;
    return b0;
  }
  // NOTE: invalid or truncated input is U+FFFD over its maximal invalid subpart (as
  // ToValidUtf8), never a read past the end: callers such as the chat template's trim
  // see raw request text (found by tests/fuzz/chat_template_fuzz: a message ending in a
  // lone lead byte read one byte past the string).
  size_t bad = 0;
  if (ValidSequenceLength(s, p, &bad) == 0) {
    *pos = p + (bad > 0 ? bad : 1);
    return 0xFFFD;
  }
  if (b0 < 0xE0) {
    *pos = p + 2;
    return ((b0 & 0x1F) << 6) | (byte(p + 1) & 0x3F);
  }
  if (b0 < 0xF0) {
    *pos = p + 3;
    return ((b0 & 0x0F) << 12) | ((byte(p + 1) & 0x3F) << 6) | (byte(p + 2) & 0x3F);
  }
  *pos = p + 4;
  return ((b0 & 0x07) << 18) | ((byte(p + 1) & 0x3F) << 12) | ((byte(p + 2) & 0x3F) << 6) | (byte(p + 3) & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsUnicodeWhitespace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsPythonSpace(char32_t cp) { return IsUnicodeWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

}  // namespace kvmesh::model::internal
