// GPT-2's reversible byte <-> printable-character mapping used by ByteLevel
// pre-tokenizers and decoders.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvmesh::model::internal {

// The UTF-8 text of the character that stands for byte `b`.
const std::string& ByteToChar(uint8_t b);
// Appends the mapped characters of `bytes` to `out`.
void BytesToChars(std::string_view bytes, std::string* out);
// The byte a code point stands for, or -1 when it is not one of the 256 characters.
int CharToByte(char32_t cp);

}  // namespace kvmesh::model::internal
