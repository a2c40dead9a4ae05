#include "model/internal/byte_level.h"

#include <vector>

#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

struct Tables {
  Tables() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      AppendUtf8(cp, &chars[b]);
      byte_of[cp] = b;
    }
  }
  std::array<std::string, 256> chars;
  std::array<int, 512> byte_of{};
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

const std::string& ByteToChar(uint8_t b) { return GetTables().chars[b]; }

void BytesToChars(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) out->append(t.chars[static_cast<unsigned char>(c)]);
}

int CharToByte(char32_t cp) {
  if (cp >= 512) return -1;
  const Tables& t = GetTables();
  const int b = t.byte_of[cp];
  // byte_of is zero-initialised: only code point 256 (byte 0) legitimately maps to 0.
  if (b == 0 && cp != 256) return -1;
  return b;
}

}  // namespace kvmesh::model::internal
