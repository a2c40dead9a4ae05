#include "model/internal/normalizers.h"

#include "model/internal/utf8.h"

namespace kvmesh::model::internal {

void ReplaceAll(std::string_view from, std::string_view to, std::string* text) {
  if (from.empty() || text->find(from) == std::string::npos) return;
  std::string out;
  out.reserve(text->size() + text->size() / 4);
  size_t pos = 0;
  while (true) {
    const size_t hit = text->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*text, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*text, pos, std::string::npos);
  *text = std::move(out);
}

void ReplaceNormalizer::Normalize(std::string* text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pattern_->FindAll(*text, &matches);
  if (matches.empty()) return;
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  for (const auto& [begin, end] : matches) {
    out.append(*text, pos, begin - pos);
    out.append(content_);
    pos = end;
  }
  out.append(*text, pos, std::string::npos);
  *text = std::move(out);
}

void StripNormalizer::Normalize(std::string* text) const {
  size_t begin = 0;
  size_t end = text->size();
  if (left_) {
    while (begin < end) {
      size_t p = begin;
      if (!IsUnicodeWhitespace(DecodeUtf8(*text, &p))) break;
      begin = p;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
      size_t p = start;
      if (!IsUnicodeWhitespace(DecodeUtf8(*text, &p))) break;
      end = start;
    }
  }
  *text = text->substr(begin, end - begin);
}

void CollapseSpacesNormalizer::Normalize(std::string* text) const {
  std::string out;
  out.reserve(text->size());
  bool pending_space = false;
  for (char c : *text) {
    if (c == ' ') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  *text = std::move(out);
}

}  // namespace kvmesh::model::internal
