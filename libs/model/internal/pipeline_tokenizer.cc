#include "model/internal/pipeline_tokenizer.h"

#include "model/internal/utf8.h"

namespace kvmesh::model::internal {

PipelineTokenizer::PipelineTokenizer(PipelineParts parts)
    : normalizer_(std::move(parts.normalizer)),
      pre_tokenizer_(std::move(parts.pre_tokenizer)),
      model_(std::move(parts.model)),
      post_processor_(std::move(parts.post_processor)),
      decoder_(std::move(parts.decoder)) {
  const Normalizer* normalizer = normalizer_.get();
  added_ = std::make_unique<AddedVocabulary>(std::move(parts.added_tokens), [normalizer](std::string_view content) {
    std::string s(content);
    if (normalizer != nullptr) normalizer->Normalize(&s);
    return s;
  });
  vocab_size_ = model_->id_end();
  for (const AddedToken& t : added_->tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);
}

std::vector<int32_t> PipelineTokenizer::Encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  std::string_view text = input;
  if (!IsValidUtf8(input)) {
    repaired = ToValidUtf8(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (added_->has_tokens(/*normalized_kind=*/false)) {
    std::vector<TextSplit> splits;
    added_->Split(text, /*normalized_kind=*/false, &splits);
    for (const TextSplit& s : splits) {
      if (s.token_id >= 0) {
        ids.push_back(s.token_id);
      } else {
        EncodeChunk(std::string(text.substr(s.begin, s.end - s.begin)), s.begin == 0, &ids);
      }
    }
  } else {
    EncodeChunk(std::string(text), true, &ids);
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

void PipelineTokenizer::EncodeChunk(std::string chunk, bool at_origin, std::vector<int32_t>* ids) const {
  if (chunk.empty()) return;
  if (normalizer_ != nullptr) normalizer_->Normalize(&chunk);
  if (chunk.empty()) return;
  if (!added_->has_tokens(/*normalized_kind=*/true)) {
    EncodeWords(std::move(chunk), at_origin, ids);
    return;
  }
  std::vector<TextSplit> splits;
  added_->Split(chunk, /*normalized_kind=*/true, &splits);
  if (splits.size() == 1 && splits[0].token_id < 0) {
    EncodeWords(std::move(chunk), at_origin, ids);
    return;
  }
  for (const TextSplit& s : splits) {
    if (s.token_id >= 0) {
      ids->push_back(s.token_id);
    } else {
      EncodeWords(chunk.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0, ids);
    }
  }
}

void PipelineTokenizer::EncodeWords(std::string text, bool at_origin, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  if (pre_tokenizer_ == nullptr) {
    model_->Tokenize(text, ids);
    return;
  }
  std::vector<PreToken> pieces;
  pieces.push_back(PreToken{std::move(text), at_origin});
  pre_tokenizer_->PreTokenize(&pieces);
  for (const PreToken& piece : pieces) model_->Tokenize(piece.text, ids);
}

std::string PipelineTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* added = added_->FindById(id)) {
      if (skip_special_tokens && added->special) continue;
      tokens.push_back(added->content);
    } else if (const std::string* token = model_->IdToToken(id)) {
      tokens.push_back(*token);
    }
  }
  if (decoder_ == nullptr) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  decoder_->DecodeChain(&tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::optional<int32_t> PipelineTokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* added = added_->FindByContent(token)) return added->id;
  return model_->TokenToId(token);
}

std::string PipelineTokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* added = added_->FindById(id)) return added->content;
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::string();
}

bool PipelineTokenizer::IsSpecial(int32_t id) const {
  const AddedToken* added = added_->FindById(id);
  return added != nullptr && added->special;
}

}  // namespace kvmesh::model::internal
