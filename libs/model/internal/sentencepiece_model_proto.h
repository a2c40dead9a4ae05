// A reader for SentencePiece's ModelProto (tokenizer.model) written against
// the protobuf wire format, so kvmesh never links libsentencepiece (whose
// bundled protobuf cannot share a process with gRPC). Only the fields a BPE
// tokenizer needs are kept; unknown fields are skipped.
//
//   ModelProto      { repeated SentencePiece pieces = 1; TrainerSpec trainer_spec = 2;
//                     NormalizerSpec normalizer_spec = 3; }
//   SentencePiece   { string piece = 1; float score = 2; Type type = 3; }
//   TrainerSpec     { ModelType model_type = 3; int32 vocab_size = 4; bool split_by_whitespace = ...;
//                     bool byte_fallback = 35; int32 unk_id = 40; bos_id = 41; eos_id = 42; pad_id = 43; }
//   NormalizerSpec  { string name = 1; bytes precompiled_charsmap = 2; bool add_dummy_prefix = 3;
//                     bool remove_extra_whitespaces = 4; bool escape_whitespaces = 5; }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::model::internal {

struct SentencePieceModel {
  enum class PieceType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  enum class ModelType : int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  struct Piece {
    std::string piece;
    float score = 0.0f;
    PieceType type = PieceType::kNormal;
  };
  std::vector<Piece> pieces;
  // TrainerSpec (proto defaults).
  ModelType model_type = ModelType::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  int32_t unk_id = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  int32_t pad_id = -1;
  // NormalizerSpec (proto defaults).
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// DataLoss naming `path` when the bytes are truncated or not a well-formed
// message; InvalidArgument when a field has the wrong wire type.
absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes, const std::string& path);

}  // namespace kvmesh::model::internal
