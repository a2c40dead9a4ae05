// Builds a PipelineTokenizer from `tokenizers`' tokenizer.json. Every
// unsupported component is an InvalidArgument naming the file and the
// component; malformed JSON is an InvalidArgument with the parser's message.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/internal/pipeline_tokenizer.h"

namespace kvmesh::model::internal {

absl::StatusOr<std::unique_ptr<PipelineTokenizer>> LoadTokenizerJson(const std::string& json_text,
                                                                     const std::string& path);

}  // namespace kvmesh::model::internal
