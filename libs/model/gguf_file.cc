#include "model/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace kvmesh::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read little-endian
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 4;

const char* TypeName(GgufValue::Type t) {
  switch (t) {
    case GgufValue::Type::kUInt8: return "uint8";
    case GgufValue::Type::kInt8: return "int8";
    case GgufValue::Type::kUInt16: return "uint16";
    case GgufValue::Type::kInt16: return "int16";
    case GgufValue::Type::kUInt32: return "uint32";
    case GgufValue::Type::kInt32: return "int32";
    case GgufValue::Type::kFloat32: return "float32";
    case GgufValue::Type::kBool: return "bool";
    case GgufValue::Type::kString: return "string";
    case GgufValue::Type::kArray: return "array";
    case GgufValue::Type::kUInt64: return "uint64";
    case GgufValue::Type::kInt64: return "int64";
    case GgufValue::Type::kFloat64: return "float64";
  }
  return "?";
}

// Bytes of one scalar of `t` (0 for string/array, whose size is variable).
int64_t ScalarBytes(GgufValue::Type t) {
  switch (t) {
    case GgufValue::Type::kUInt8:
    case GgufValue::Type::kInt8:
    case GgufValue::Type::kBool: return 1;
    case GgufValue::Type::kUInt16:
    case GgufValue::Type::kInt16: return 2;
    case GgufValue::Type::kUInt32:
    case GgufValue::Type::kInt32:
    case GgufValue::Type::kFloat32: return 4;
    case GgufValue::Type::kUInt64:
    case GgufValue::Type::kInt64:
    case GgufValue::Type::kFloat64: return 8;
    default: return 0;
  }
}

bool IsIntType(GgufValue::Type t) {
  return t == GgufValue::Type::kUInt8 || t == GgufValue::Type::kInt8 || t == GgufValue::Type::kUInt16 ||
         t == GgufValue::Type::kInt16 || t == GgufValue::Type::kUInt32 || t == GgufValue::Type::kInt32 ||
         t == GgufValue::Type::kUInt64 || t == GgufValue::Type::kInt64;
}
bool IsFloatType(GgufValue::Type t) { return t == GgufValue::Type::kFloat32 || t == GgufValue::Type::kFloat64; }

// A bounds-checked little-endian cursor over the file. Every read names what it
// was reading so a truncated file says which key or tensor ran past the end.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Truncated(const std::string& what, uint64_t need) const {
    return absl::DataLossError(absl::StrCat(path_, ": truncated: ", what, " needs ", need, " bytes at offset ", pos_,
                                            " but the file has ", bytes_.size(), " bytes"));
  }

  template <typename T>
  absl::StatusOr<T> Read(const std::string& what) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(const std::string& what) {
    KVMESH_ASSIGN_OR_RETURN(const uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::DataLossError(absl::StrCat(path_, ": ", what, ": string length ", len, " at offset ", pos_ - 8,
                                              " runs past the end of the file (", remaining(), " bytes left)"));
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufValue::Type> ReadValueType(Cursor& c, const std::string& path, const std::string& what) {
  KVMESH_ASSIGN_OR_RETURN(const uint32_t t, c.Read<uint32_t>(what));
  if (t > static_cast<uint32_t>(GgufValue::Type::kFloat64)) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, ": unknown value type ", t));
  }
  return static_cast<GgufValue::Type>(t);
}

// One scalar of type `t` as int64 / double / bool / string.
absl::StatusOr<std::variant<int64_t, double, bool, std::string>> ReadScalar(Cursor& c, GgufValue::Type t,
                                                                           const std::string& path,
                                                                           const std::string& what) {
  using T = GgufValue::Type;
  switch (t) {
    case T::kUInt8: { KVMESH_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(what)); return int64_t{v}; }
    case T::kInt8: { KVMESH_ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>(what)); return int64_t{v}; }
    case T::kUInt16: { KVMESH_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>(what)); return int64_t{v}; }
    case T::kInt16: { KVMESH_ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>(what)); return int64_t{v}; }
    case T::kUInt32: { KVMESH_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>(what)); return int64_t{v}; }
    case T::kInt32: { KVMESH_ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>(what)); return int64_t{v}; }
    case T::kInt64: { KVMESH_ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>(what)); return v; }
    case T::kUInt64: {
      KVMESH_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>(what));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::DataLossError(absl::StrCat(path, ": ", what, ": uint64 value ", v, " is out of range"));
      }
      return static_cast<int64_t>(v);
    }
    case T::kFloat32: { KVMESH_ASSIGN_OR_RETURN(float v, c.Read<float>(what)); return double{v}; }
    case T::kFloat64: { KVMESH_ASSIGN_OR_RETURN(double v, c.Read<double>(what)); return v; }
    case T::kBool: {
      KVMESH_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(what));
      if (v > 1) return absl::DataLossError(absl::StrCat(path, ": ", what, ": bool value ", int{v}, " is not 0 or 1"));
      return v == 1;
    }
    case T::kString: { KVMESH_ASSIGN_OR_RETURN(std::string s, c.ReadString(what)); return s; }
    case T::kArray: break;
  }
  return absl::InternalError("ReadScalar on an array");
}

absl::Status ReadArray(Cursor& c, GgufValue* out, const std::string& path, const std::string& what, int depth) {
  if (depth > kMaxArrayNesting) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, ": arrays nested deeper than ", kMaxArrayNesting));
  }
  KVMESH_ASSIGN_OR_RETURN(out->array_type, ReadValueType(c, path, what + " element type"));
  KVMESH_ASSIGN_OR_RETURN(out->array_size, c.Read<uint64_t>(what + " array length"));
  // Every element takes at least one byte (a string its 8-byte length): a count
  // the rest of the file cannot hold is corruption, refused before any allocation.
  const uint64_t min_bytes = out->array_type == GgufValue::Type::kString  ? 8
                             : out->array_type == GgufValue::Type::kArray ? 12
                                                                           : ScalarBytes(out->array_type);
  if (out->array_size > c.remaining() / min_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, ": array of ", out->array_size, " ",
                                            TypeName(out->array_type), " elements at offset ", c.pos() - 12,
                                            " runs past the end of the file (", c.remaining(), " bytes left)"));
  }
  for (uint64_t i = 0; i < out->array_size; ++i) {
    if (out->array_type == GgufValue::Type::kArray) {
      GgufValue nested;
      KVMESH_RETURN_IF_ERROR(ReadArray(c, &nested, path, absl::StrCat(what, "[", i, "]"), depth + 1));
      continue;
    }
    KVMESH_ASSIGN_OR_RETURN(auto v, ReadScalar(c, out->array_type, path, absl::StrCat(what, "[", i, "]")));
    if (auto* p = std::get_if<int64_t>(&v)) {
      out->ints.push_back(*p);
    } else if (auto* d = std::get_if<double>(&v)) {
      out->floats.push_back(*d);
    } else if (auto* b = std::get_if<bool>(&v)) {
      out->ints.push_back(*b ? 1 : 0);
    } else {
      out->strings.push_back(std::move(std::get<std::string>(v)));
    }
  }
  return absl::OkStatus();
}

absl::Status ErrnoStatus(int err, const std::string& path, const std::string& what) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

}  // namespace

std::optional<GgmlTypeLayout> LayoutOf(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kF32: return GgmlTypeLayout{"F32", 1, 4};
    case GgmlType::kF16: return GgmlTypeLayout{"F16", 1, 2};
    case GgmlType::kBF16: return GgmlTypeLayout{"BF16", 1, 2};
    case GgmlType::kQ4_0: return GgmlTypeLayout{"Q4_0", 32, 18};
    case GgmlType::kQ4_1: return GgmlTypeLayout{"Q4_1", 32, 20};
    case GgmlType::kQ5_0: return GgmlTypeLayout{"Q5_0", 32, 22};
    case GgmlType::kQ5_1: return GgmlTypeLayout{"Q5_1", 32, 24};
    case GgmlType::kQ8_0: return GgmlTypeLayout{"Q8_0", 32, 34};
    case GgmlType::kQ8_1: return GgmlTypeLayout{"Q8_1", 32, 36};
    case GgmlType::kQ2_K: return GgmlTypeLayout{"Q2_K", 256, 84};
    case GgmlType::kQ3_K: return GgmlTypeLayout{"Q3_K", 256, 110};
    case GgmlType::kQ4_K: return GgmlTypeLayout{"Q4_K", 256, 144};
    case GgmlType::kQ5_K: return GgmlTypeLayout{"Q5_K", 256, 176};
    case GgmlType::kQ6_K: return GgmlTypeLayout{"Q6_K", 256, 210};
    case GgmlType::kQ8_K: return GgmlTypeLayout{"Q8_K", 256, 292};
  }
  return std::nullopt;
}

bool IsGgufPath(const std::string& path) { return absl::EndsWithIgnoreCase(path, ".gguf"); }

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, bytes_.size());
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot open GGUF file");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, path, "cannot mmap");
    }
    file->mapping_ = m;
    file->bytes_ = {static_cast<const uint8_t*>(m), size};
  }
  close(fd);
  KVMESH_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::span<const uint8_t> bytes, const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->bytes_ = bytes;
  KVMESH_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status GgufFile::Parse() {
  Cursor c(bytes_, path_);
  // 1. Header: magic, version, counts.
  if (bytes_.size() < 4) {
    return absl::DataLossError(absl::StrCat(path_, ": not a GGUF file: ", bytes_.size(), " bytes, no magic"));
  }
  KVMESH_ASSIGN_OR_RETURN(const uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrCat(path_, ": not a GGUF file: magic is 0x", absl::Hex(magic, absl::kZeroPad8),
                                            ", expected \"GGUF\""));
  }
  KVMESH_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": GGUF version ", version_, " is not supported (supported: 2, 3)"));
  }
  KVMESH_ASSIGN_OR_RETURN(const uint64_t tensor_count, c.Read<uint64_t>("tensor count"));
  KVMESH_ASSIGN_OR_RETURN(const uint64_t kv_count, c.Read<uint64_t>("metadata key/value count"));
  // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor
  // info 8 + 4 + 4 + 8: counts beyond that are corruption.
  if (kv_count > c.remaining() / 13) {
    return absl::DataLossError(absl::StrCat(path_, ": metadata key/value count ", kv_count,
                                            " cannot fit in the file's ", bytes_.size(), " bytes"));
  }
  if (tensor_count > c.remaining() / 24) {
    return absl::DataLossError(
        absl::StrCat(path_, ": tensor count ", tensor_count, " cannot fit in the file's ", bytes_.size(), " bytes"));
  }

  // 2. Metadata.
  for (uint64_t i = 0; i < kv_count; ++i) {
    KVMESH_ASSIGN_OR_RETURN(std::string key, c.ReadString(absl::StrCat("metadata key #", i)));
    const std::string what = absl::StrCat("metadata key '", key, "'");
    if (metadata_.contains(key)) return absl::DataLossError(absl::StrCat(path_, ": duplicate ", what));
    GgufValue value;
    KVMESH_ASSIGN_OR_RETURN(value.type, ReadValueType(c, path_, what));
    if (value.type == GgufValue::Type::kArray) {
      KVMESH_RETURN_IF_ERROR(ReadArray(c, &value, path_, what, 1));
    } else {
      KVMESH_ASSIGN_OR_RETURN(value.scalar, ReadScalar(c, value.type, path_, what));
    }
    keys_.push_back(key);
    metadata_.emplace(std::move(key), std::move(value));
  }
  if (const GgufValue* a = Find("general.alignment")) {
    if (a->type != GgufValue::Type::kUInt32) {
      return absl::DataLossError(
          absl::StrCat(path_, ": metadata key 'general.alignment' must be uint32, got ", TypeName(a->type)));
    }
    const int64_t v = std::get<int64_t>(a->scalar);
    if (v <= 0 || (v & (v - 1)) != 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": metadata key 'general.alignment' is ", v, ", not a positive power of two"));
    }
    alignment_ = static_cast<uint64_t>(v);
  }

  // 3. Tensor infos.
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    KVMESH_ASSIGN_OR_RETURN(t.name, c.ReadString(absl::StrCat("tensor #", i, " name")));
    const std::string what = absl::StrCat("tensor '", t.name, "'");
    if (tensor_index_.contains(t.name)) return absl::DataLossError(absl::StrCat(path_, ": duplicate ", what));
    KVMESH_ASSIGN_OR_RETURN(const uint32_t n_dims, c.Read<uint32_t>(what + " rank"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::DataLossError(absl::StrCat(path_, ": ", what, ": rank ", n_dims, " is not in 1..", kMaxDims));
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      KVMESH_ASSIGN_OR_RETURN(const uint64_t dim, c.Read<uint64_t>(absl::StrCat(what, " dim ", d)));
      if (dim == 0 || dim > (1ull << 40)) {
        return absl::DataLossError(absl::StrCat(path_, ": ", what, ": dim ", d, " is ", dim));
      }
      if (static_cast<uint64_t>(elements) > (std::numeric_limits<int64_t>::max() / 8) / dim) {
        return absl::DataLossError(absl::StrCat(path_, ": ", what, ": element count overflows"));
      }
      elements *= static_cast<int64_t>(dim);
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.num_elements = elements;
    KVMESH_ASSIGN_OR_RETURN(t.type, c.Read<uint32_t>(what + " type"));
    const std::optional<GgmlTypeLayout> layout = LayoutOf(t.type);
    if (!layout) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what, ": ggml type ", t.type, " is not supported"));
    }
    if (t.dims[0] % layout->block_elements != 0) {
      return absl::DataLossError(absl::StrCat(path_, ": ", what, ": row length ", t.dims[0], " is not a multiple of ",
                                              layout->name, "'s block of ", layout->block_elements));
    }
    t.num_bytes = elements / layout->block_elements * layout->block_bytes;
    KVMESH_ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>(what + " offset"));
    if (t.offset % alignment_ != 0) {
      return absl::DataLossError(absl::StrCat(path_, ": ", what, ": data offset ", t.offset,
                                              " is not a multiple of the alignment ", alignment_));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // 4. Data section: the next multiple of the alignment; every tensor inside it,
  //    none overlapping.
  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (tensors_.empty()) return absl::OkStatus();
  if (data_start > bytes_.size()) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated: the data section starts at offset ", data_start,
                                            " but the file has ", bytes_.size(), " bytes"));
  }
  data_section_ = bytes_.data() + data_start;
  const uint64_t data_bytes = bytes_.size() - data_start;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_) {
    if (t.offset > data_bytes || static_cast<uint64_t>(t.num_bytes) > data_bytes - t.offset) {
      const std::optional<GgmlTypeLayout> layout = LayoutOf(t.type);
      return absl::DataLossError(absl::StrCat(
          path_, ": tensor '", t.name, "' (", layout->name, ", ", t.num_bytes, " bytes at data offset ", t.offset,
          ") runs past the end of the file: the data section has ", data_bytes, " bytes"));
    }
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    if (prev.offset + static_cast<uint64_t>(prev.num_bytes) > by_offset[i]->offset) {
      return absl::DataLossError(absl::StrCat(path_, ": tensor '", by_offset[i]->name, "' at data offset ",
                                              by_offset[i]->offset, " overlaps tensor '", prev.name, "' (bytes ",
                                              prev.offset, "..", prev.offset + prev.num_bytes, ")"));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
absl::Status Mistyped(const std::string& path, const std::string& key, const std::string& want, const GgufValue& v) {
  std::string got = TypeName(v.type);
  if (v.type == GgufValue::Type::kArray) got = absl::StrCat("array of ", TypeName(v.array_type));
  return absl::InvalidArgumentError(absl::StrCat(path, ": metadata key '", key, "' must be ", want, ", got ", got));
}
}  // namespace

absl::StatusOr<std::optional<int64_t>> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!IsIntType(v->type)) return Mistyped(path_, key, "an integer", *v);
  return std::optional<int64_t>(std::get<int64_t>(v->scalar));
}

absl::StatusOr<std::optional<double>> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  if (IsFloatType(v->type)) return std::optional<double>(std::get<double>(v->scalar));
  if (IsIntType(v->type)) return std::optional<double>(static_cast<double>(std::get<int64_t>(v->scalar)));
  return Mistyped(path_, key, "a number", *v);
}

absl::StatusOr<std::optional<bool>> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != GgufValue::Type::kBool) return Mistyped(path_, key, "a bool", *v);
  return std::optional<bool>(std::get<bool>(v->scalar));
}

absl::StatusOr<std::optional<std::string>> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufValue::Type::kString) return Mistyped(path_, key, "a string", *v);
  return std::optional<std::string>(std::get<std::string>(v->scalar));
}

absl::StatusOr<int64_t> GgufFile::RequiredInt(const std::string& key) const {
  KVMESH_ASSIGN_OR_RETURN(const std::optional<int64_t> v, GetInt(key));
  if (!v) return absl::InvalidArgumentError(absl::StrCat(path_, ": missing required metadata key '", key, "'"));
  return *v;
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return nullptr;
  if (v->type != GgufValue::Type::kArray || v->array_type != GgufValue::Type::kString) {
    return Mistyped(path_, key, "an array of strings", *v);
  }
  return &v->strings;
}

absl::StatusOr<const std::vector<int64_t>*> GgufFile::GetIntArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return nullptr;
  if (v->type != GgufValue::Type::kArray || !IsIntType(v->array_type)) {
    return Mistyped(path_, key, "an array of integers", *v);
  }
  return &v->ints;
}

absl::StatusOr<const std::vector<double>*> GgufFile::GetFloatArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return nullptr;
  if (v->type != GgufValue::Type::kArray || !IsFloatType(v->array_type)) {
    return Mistyped(path_, key, "an array of numbers", *v);
  }
  return &v->floats;
}

}  // namespace kvmesh::model
