// PipelineTokenizer: the Tokenizer behind both tokenizer.json and
// tokenizer.model. It runs the `tokenizers` pipeline: added-token extraction
// (raw, then on normalized text), normalizer, pre-tokenizer, BPE model,
// post-processor; and for Decode the decoder chain over token strings.
//
// Thread-safety: immutable after loading (the setters are for the loaders);
// Encode/Decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/internal/added_vocabulary.h"
#include "model/internal/bpe_model.h"
#include "model/internal/decoders.h"
#include "model/internal/normalizers.h"
#include "model/internal/post_processors.h"
#include "model/internal/pre_tokenizers.h"
#include "model/tokenizer.h"

namespace kvmesh::model::internal {

struct PipelineParts {
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<BpeModel> model;              // required
  std::unique_ptr<PostProcessor> post_processor;  // may be null
  std::unique_ptr<Decoder> decoder;             // may be null: tokens joined with ' '
  std::vector<AddedToken> added_tokens;
};

class PipelineTokenizer : public Tokenizer {
 public:
  explicit PipelineTokenizer(PipelineParts parts);

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::string IdToToken(int32_t id) const override;
  bool IsSpecial(int32_t id) const override;
  std::optional<int32_t> bos_token_id() const override { return bos_id_; }
  std::optional<int32_t> eos_token_id() const override { return eos_id_; }

  // For the loaders.
  void set_bos_token_id(std::optional<int32_t> id) { bos_id_ = id; }
  void set_eos_token_id(std::optional<int32_t> id) { eos_id_ = id; }
  void set_post_processor(std::unique_ptr<PostProcessor> p) { post_processor_ = std::move(p); }
  const PostProcessor* post_processor() const { return post_processor_.get(); }
  const AddedVocabulary& added_vocabulary() const { return *added_; }

 private:
  void EncodeChunk(std::string chunk, bool at_origin, std::vector<int32_t>* ids) const;
  void EncodeWords(std::string text, bool at_origin, std::vector<int32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<AddedVocabulary> added_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

}  // namespace kvmesh::model::internal
