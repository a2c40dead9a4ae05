#include "model/internal/sentencepiece_model_proto.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::model::internal {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

// One field of a message: its number, wire type and value.
struct Field {
  uint32_t number;
  uint32_t wire_type;
  uint64_t varint;         // kVarint, kFixed64, kFixed32
  std::string_view bytes;  // kLengthDelimited
};

class WireReader {
 public:
  WireReader(std::string_view data, const std::string& path, std::string_view where)
      : data_(data), path_(path), where_(where) {}

  bool done() const { return pos_ >= data_.size(); }

  absl::Status Next(Field* field) {
    uint64_t key = 0;
    KVMESH_RETURN_IF_ERROR(Varint(&key));
    field->number = static_cast<uint32_t>(key >> 3);
    field->wire_type = static_cast<uint32_t>(key & 7);
    if (field->number == 0) return Corrupt("field number 0");
    switch (field->wire_type) {
      case kVarint:
        return Varint(&field->varint);
      case kFixed64:
        return Fixed(8, &field->varint);
      case kFixed32:
        return Fixed(4, &field->varint);
      case kLengthDelimited: {
        uint64_t len = 0;
        KVMESH_RETURN_IF_ERROR(Varint(&len));
        if (len > data_.size() - pos_) return Corrupt("length-delimited field runs past the end");
        field->bytes = data_.substr(pos_, len);
        pos_ += len;
        return absl::OkStatus();
      }
      default:
        return Corrupt(absl::StrCat("unsupported wire type ", field->wire_type));
    }
  }

  absl::Status Corrupt(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(path_, ": corrupt or truncated SentencePiece model (",
                                            absl::string_view(where_.data(), where_.size()), " at byte ", pos_,
                                            "): ", what));
  }

 private:
  absl::Status Varint(uint64_t* out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Corrupt("truncated varint");
      const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *out = value;
        return absl::OkStatus();
      }
    }
    return Corrupt("varint longer than 10 bytes");
  }
  absl::Status Fixed(size_t n, uint64_t* out) {
    if (data_.size() - pos_ < n) return Corrupt("truncated fixed-width field");
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    *out = value;
    return absl::OkStatus();
  }

  std::string_view data_;
  size_t pos_ = 0;
  const std::string& path_;
  std::string_view where_;
};

absl::Status ExpectWireType(const Field& f, uint32_t wire_type, const std::string& path, std::string_view name) {
  if (f.wire_type == wire_type) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path, ": SentencePiece field ", absl::string_view(name.data(), name.size()),
                                                 " (", f.number, ") has wire type ", f.wire_type, ", expected ",
                                                 wire_type));
}

absl::Status ParsePiece(std::string_view bytes, const std::string& path, SentencePieceModel::Piece* piece) {
  WireReader reader(bytes, path, "SentencePiece");
  Field f;
  while (!reader.done()) {
    KVMESH_RETURN_IF_ERROR(reader.Next(&f));
    if (f.number == 1) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "piece"));
      piece->piece = std::string(f.bytes);
    } else if (f.number == 2) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kFixed32, path, "score"));
      const uint32_t bits = static_cast<uint32_t>(f.varint);
      std::memcpy(&piece->score, &bits, sizeof(bits));
    } else if (f.number == 3) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "type"));
      piece->type = static_cast<SentencePieceModel::PieceType>(static_cast<int32_t>(f.varint));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTrainerSpec(std::string_view bytes, const std::string& path, SentencePieceModel* model) {
  WireReader reader(bytes, path, "TrainerSpec");
  Field f;
  while (!reader.done()) {
    KVMESH_RETURN_IF_ERROR(reader.Next(&f));
    const auto as_int = [&] { return static_cast<int32_t>(static_cast<int64_t>(f.varint)); };
    switch (f.number) {
      case 3:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "model_type"));
        model->model_type = static_cast<SentencePieceModel::ModelType>(as_int());
        break;
      case 24:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "treat_whitespace_as_suffix"));
        model->treat_whitespace_as_suffix = f.varint != 0;
        break;
      case 35:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "byte_fallback"));
        model->byte_fallback = f.varint != 0;
        break;
      case 40:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "unk_id"));
        model->unk_id = as_int();
        break;
      case 41:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "bos_id"));
        model->bos_id = as_int();
        break;
      case 42:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "eos_id"));
        model->eos_id = as_int();
        break;
      case 43:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "pad_id"));
        model->pad_id = as_int();
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizerSpec(std::string_view bytes, const std::string& path, SentencePieceModel* model) {
  WireReader reader(bytes, path, "NormalizerSpec");
  Field f;
  while (!reader.done()) {
    KVMESH_RETURN_IF_ERROR(reader.Next(&f));
    switch (f.number) {
      case 1:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "name"));
        model->normalizer_name = std::string(f.bytes);
        break;
      case 2:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "precompiled_charsmap"));
        model->precompiled_charsmap = std::string(f.bytes);
        break;
      case 3:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "add_dummy_prefix"));
        model->add_dummy_prefix = f.varint != 0;
        break;
      case 4:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "remove_extra_whitespaces"));
        model->remove_extra_whitespaces = f.varint != 0;
        break;
      case 5:
        KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kVarint, path, "escape_whitespaces"));
        model->escape_whitespaces = f.varint != 0;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(std::string_view bytes, const std::string& path) {
  SentencePieceModel model;
  WireReader reader(bytes, path, "ModelProto");
  Field f;
  bool has_trainer_spec = false;
  bool has_normalizer_spec = false;
  while (!reader.done()) {
    KVMESH_RETURN_IF_ERROR(reader.Next(&f));
    if (f.number == 1) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "pieces"));
      SentencePieceModel::Piece piece;
      KVMESH_RETURN_IF_ERROR(ParsePiece(f.bytes, path, &piece));
      model.pieces.push_back(std::move(piece));
    } else if (f.number == 2) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "trainer_spec"));
      KVMESH_RETURN_IF_ERROR(ParseTrainerSpec(f.bytes, path, &model));
      has_trainer_spec = true;
    } else if (f.number == 3) {
      KVMESH_RETURN_IF_ERROR(ExpectWireType(f, kLengthDelimited, path, "normalizer_spec"));
      KVMESH_RETURN_IF_ERROR(ParseNormalizerSpec(f.bytes, path, &model));
      has_normalizer_spec = true;
    }
  }
  if (model.pieces.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": SentencePiece model has no pieces (empty or not a model file)"));
  }
  // SentencePiece writes both specs after the pieces: a cut file loses them.
  if (!has_trainer_spec || !has_normalizer_spec) {
    return absl::DataLossError(
        absl::StrCat(path, ": SentencePiece model has no ", has_trainer_spec ? "normalizer_spec" : "trainer_spec",
                     " (truncated?)"));
  }
  return model;
}

}  // namespace kvmesh::model::internal
