#include "model/internal/sentencepiece_tokenizer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "model/internal/utf8.h"

namespace kvmesh::model::internal {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581

using PieceType = SentencePieceModel::PieceType;

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineTokenizer>> BuildSentencePieceTokenizer(const SentencePieceModel& model,
                                                                              const SentencePieceOptions& options,
                                                                              const std::string& path) {
  const auto error = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", what)); };
  if (model.model_type != SentencePieceModel::ModelType::kBpe) {
    return error(absl::StrCat("unsupported SentencePiece model type ", static_cast<int>(model.model_type),
                              " (only BPE = 2 is supported)"));
  }
  if (!model.precompiled_charsmap.empty() ||
      !(model.normalizer_name.empty() || model.normalizer_name == "identity")) {
    return error(absl::StrCat("unsupported SentencePiece normalizer '", model.normalizer_name,
                              "' (only identity is supported)"));
  }
  if (model.treat_whitespace_as_suffix) return error("unsupported SentencePiece option treat_whitespace_as_suffix");

  const int32_t n = static_cast<int32_t>(model.pieces.size());
  absl::flat_hash_map<std::string, int32_t> vocab;
  vocab.reserve(n);
  std::vector<AddedToken> added;
  for (int32_t id = 0; id < n; ++id) {
    const auto& p = model.pieces[id];
    vocab.emplace(p.piece, id);  // NOTE: the first of duplicate pieces keeps its id
    if (p.type == PieceType::kControl || p.type == PieceType::kUnknown || p.type == PieceType::kUserDefined) {
      added.push_back(AddedToken{.id = id,
                                 .content = p.piece,
                                 .normalized = false,
                                 .special = p.type != PieceType::kUserDefined});
    }
  }
  // Merges: every split of a mergeable piece into two known mergeable pieces.
  // Rank is the dense rank of the merged piece's score (equal scores share a
  // rank so that ties go to the leftmost pair, as in SentencePiece).
  const auto mergeable = [&](int32_t id) {
    const PieceType t = model.pieces[id].type;
    return t == PieceType::kNormal || t == PieceType::kUserDefined;
  };
  std::vector<float> scores;
  for (int32_t id = 0; id < n; ++id) {
    if (mergeable(id)) scores.push_back(model.pieces[id].score);
  }
  std::sort(scores.begin(), scores.end(), std::greater<float>());
  scores.erase(std::unique(scores.begin(), scores.end()), scores.end());
  std::vector<BpeMerge> merges;
  for (int32_t id = 0; id < n; ++id) {
    if (!mergeable(id)) continue;
    const std::string& piece = model.pieces[id].piece;
    const int32_t rank = static_cast<int32_t>(
        std::lower_bound(scores.begin(), scores.end(), model.pieces[id].score, std::greater<float>()) - scores.begin());
    for (size_t cut = Utf8LeadLength(static_cast<unsigned char>(piece[0])); cut < piece.size();
         cut += Utf8LeadLength(static_cast<unsigned char>(piece[cut]))) {
      auto l = vocab.find(piece.substr(0, cut));
      auto r = vocab.find(piece.substr(cut));
      if (l == vocab.end() || r == vocab.end() || !mergeable(l->second) || !mergeable(r->second)) continue;
      merges.push_back(BpeMerge{l->second, r->second, rank, id});
    }
  }
  BpeOptions bpe_options;
  bpe_options.byte_fallback = model.byte_fallback;
  bpe_options.fuse_unk = true;
  if (model.unk_id >= 0 && model.unk_id < n) bpe_options.unk_token = model.pieces[model.unk_id].piece;
  auto bpe = BpeModel::CreateWithMerges(std::move(vocab), merges, std::move(bpe_options));
  if (!bpe.ok()) return error(std::string(bpe.status().message()));

  PipelineParts parts;
  parts.model = std::move(bpe).value();
  parts.added_tokens = std::move(added);
  std::vector<std::unique_ptr<Normalizer>> normalizers;
  if (model.remove_extra_whitespaces) normalizers.push_back(std::make_unique<CollapseSpacesNormalizer>());
  if (model.add_dummy_prefix) normalizers.push_back(std::make_unique<PrependNormalizer>(" "));
  if (model.escape_whitespaces) {
    normalizers.push_back(std::make_unique<ReplaceNormalizer>(Regex::Literal(" ").value(), kSpace));
  }
  parts.normalizer = std::make_unique<SequenceNormalizer>(std::move(normalizers));

  std::vector<std::unique_ptr<Decoder>> decoders;
  decoders.push_back(std::make_unique<ReplaceDecoder>(Regex::Literal(kSpace).value(), " "));
  if (model.byte_fallback) decoders.push_back(std::make_unique<ByteFallbackDecoder>());
  decoders.push_back(std::make_unique<FuseDecoder>());
  if (model.add_dummy_prefix) decoders.push_back(std::make_unique<StripDecoder>(" ", 1, 0));
  parts.decoder = std::make_unique<SequenceDecoder>(std::move(decoders));

  const auto valid = [&](int32_t id) { return id >= 0 && id < n; };
  std::vector<int32_t> prefix, suffix;
  if (options.add_bos && valid(model.bos_id)) prefix.push_back(model.bos_id);
  if (options.add_eos && valid(model.eos_id)) suffix.push_back(model.eos_id);
  parts.post_processor = std::make_unique<WrapPostProcessor>(std::move(prefix), std::move(suffix));

  auto tokenizer = std::make_unique<PipelineTokenizer>(std::move(parts));
  if (valid(model.bos_id)) tokenizer->set_bos_token_id(model.bos_id);
  if (valid(model.eos_id)) tokenizer->set_eos_token_id(model.eos_id);
  return tokenizer;
}

}  // namespace kvmesh::model::internal
