// Builds a PipelineTokenizer equivalent to a SentencePiece BPE model (Llama 2
// style): whitespace -> U+2581 with a dummy prefix, pairs merged by the score of
// the merged piece (higher first, leftmost on ties), byte fallback <0xNN>, and
// the decoder `transformers` uses for such models. Control and unknown pieces
// are special tokens; user-defined pieces are matched in the text.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/internal/pipeline_tokenizer.h"
#include "model/internal/sentencepiece_model_proto.h"

namespace kvmesh::model::internal {

struct SentencePieceOptions {
  bool add_bos = true;
  bool add_eos = false;
};

// InvalidArgument naming `path` for a non-BPE model or a normalizer other than
// identity (precompiled character maps are not supported).
absl::StatusOr<std::unique_ptr<PipelineTokenizer>> BuildSentencePieceTokenizer(const SentencePieceModel& model,
                                                                              const SentencePieceOptions& options,
                                                                              const std::string& path);

}  // namespace kvmesh::model::internal
