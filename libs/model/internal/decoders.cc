#include "model/internal/decoders.h"

#include "model/internal/byte_level.h"
#include "model/internal/normalizers.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xNN>" (either hex case, as Rust's from_str_radix accepts) -> byte, else -1.
int ByteToken(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const int hi = HexDigit(token[3]);
  const int lo = HexDigit(token[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

}  // namespace

void ByteLevelDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::string bytes;
  std::string mapped;
  for (const std::string& token : *tokens) {
    mapped.clear();
    bool all = true;
    size_t pos = 0;
    while (pos < token.size()) {
      const int b = CharToByte(DecodeUtf8(token, &pos));
      if (b < 0) {
        all = false;
        break;
      }
      mapped.push_back(static_cast<char>(b));
    }
    bytes.append(all ? mapped : token);
  }
  tokens->clear();
  tokens->push_back(IsValidUtf8(bytes) ? std::move(bytes) : ToValidUtf8(bytes));
}

void MetaspaceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (size_t i = 0; i < tokens->size(); ++i) {
    const bool drop = i == 0 && scheme_ != PrependScheme::kNever;
    ReplaceAll(replacement_, drop ? "" : " ", &(*tokens)[i]);
  }
}

void ReplaceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::vector<std::pair<size_t, size_t>> matches;
  for (std::string& token : *tokens) {
    matches.clear();
    pattern_->FindAll(token, &matches);
    if (matches.empty()) continue;
    std::string out;
    size_t pos = 0;
    for (const auto& [begin, end] : matches) {
      out.append(token, pos, begin - pos);
      out.append(content_);
      pos = end;
    }
    out.append(token, pos, std::string::npos);
    token = std::move(out);
  }
}

void ByteFallbackDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::vector<std::string> out;
  out.reserve(tokens->size());
  std::string bytes;
  const auto flush = [&] {
    if (bytes.empty()) return;
    if (IsValidUtf8(bytes)) {
      out.push_back(bytes);
    } else {
      for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementUtf8);
    }
    bytes.clear();
  };
  for (std::string& token : *tokens) {
    const int b = ByteToken(token);
    if (b >= 0) {
      bytes.push_back(static_cast<char>(b));
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  *tokens = std::move(out);
}

void FuseDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::string joined;
  for (const std::string& t : *tokens) joined += t;
  tokens->clear();
  tokens->push_back(std::move(joined));
}

void StripDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (std::string& token : *tokens) {
    // Code point boundaries of the token.
    std::vector<size_t> starts;
    for (size_t pos = 0; pos < token.size(); pos += Utf8LeadLength(static_cast<unsigned char>(token[pos]))) {
      starts.push_back(pos);
    }
    const size_t n = starts.size();
    const auto char_at = [&](size_t i) {
      const size_t end = i + 1 < n ? starts[i + 1] : token.size();
      return std::string_view(token).substr(starts[i], end - starts[i]);
    };
    size_t start_cut = 0;
    for (size_t i = 0; i < n && i < static_cast<size_t>(start_); ++i) {
      if (char_at(i) != content_) break;
      start_cut = i + 1;
    }
    size_t stop_cut = n;
    for (size_t i = 0; i < static_cast<size_t>(stop_) && i < n; ++i) {
      const size_t index = n - i - 1;
      if (char_at(index) != content_) break;
      stop_cut = index;
    }
    if (stop_cut < start_cut) stop_cut = start_cut;
    const size_t begin = start_cut < n ? starts[start_cut] : token.size();
    const size_t end = stop_cut < n ? starts[stop_cut] : token.size();
    token = token.substr(begin, end - begin);
  }
}

}  // namespace kvmesh::model::internal
