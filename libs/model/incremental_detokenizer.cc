// IncrementalDetokenizer: vLLM's prefix_offset / read_offset algorithm.
//
// Each Append decodes two windows that start at prefix_offset_: the already
// emitted context ids[prefix_offset_, read_offset_) and everything
// ids[prefix_offset_, end). When the second is longer and does not end in
// U+FFFD (an unfinished UTF-8 character from byte tokens), its extra text is
// final: it is emitted and both offsets move forward. Decoding from a few
// tokens back (rather than only the new ones) gives decoders that look at
// neighbours (SentencePiece spaces, byte fallback) the context they need.
#include "model/tokenizer.h"

#include <string_view>

namespace kvmesh::model {
namespace {

bool EndsWithReplacement(std::string_view s) { return s.size() >= 3 && s.substr(s.size() - 3) == "\xEF\xBF\xBD"; }

// "<0xNN>": a byte-fallback token.
bool IsByteToken(const std::string& token) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  return token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && hex(token[3]) && hex(token[4]);
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::Append(int32_t id) {
  ids_.push_back(id);
  // A ByteFallback decoder turns a whole run of byte tokens into U+FFFDs when
  // the run is not valid UTF-8, so a later byte token can change text that
  // already looked final: hold back while the last decoded token is a byte.
  for (size_t i = ids_.size(); i > read_offset_; --i) {
    const int32_t last = ids_[i - 1];
    if (skip_special_tokens_ && tokenizer_.IsSpecial(last)) continue;
    if (!tokenizer_.IsSpecial(last) && IsByteToken(tokenizer_.IdToToken(last))) return std::string();
    break;
  }
  const std::span<const int32_t> all(ids_);
  const std::string prefix_text =
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  const std::string new_text = tokenizer_.Decode(all.subspan(prefix_offset_), skip_special_tokens_);
  if (new_text.size() <= prefix_text.size() || EndsWithReplacement(new_text) ||
      new_text.compare(0, prefix_text.size(), prefix_text) != 0) {
    return std::string();
  }
  std::string out = new_text.substr(prefix_text.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  emitted_bytes_ += out.size();
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  // NOTE: one full decode per sequence: whatever the windows held back (an
  // unfinished character, a window whose text was not an extension of its
  // context) is whatever the full text has past the bytes already emitted.
  const std::string full = tokenizer_.Decode(ids_, skip_special_tokens_);
  std::string out = emitted_bytes_ < full.size() ? full.substr(emitted_bytes_) : std::string();
  prefix_offset_ = read_offset_ = ids_.size();
  emitted_bytes_ += out.size();
  return out;
}

}  // namespace kvmesh::model
