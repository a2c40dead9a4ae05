// GgufFile: a strict, memory-mapped reader of GGUF files (llama.cpp's model
// format, versions 2 and 3).
//
// Open() maps the file and validates everything before returning: the magic,
// the version, the key/value and tensor counts against what the file can hold,
// every string and array length, every value type, each tensor's rank, dims,
// ggml type and data offset (aligned to general.alignment, inside the data
// section, byte length = elements / block size x block bytes, no two tensors
// overlapping). Any violation is DataLoss naming the file and the key or
// tensor at fault; an unknown tensor type is InvalidArgument.
//
// Metadata values are copied out (they are small); tensor data stays in the
// mapping and is read through TensorData(). Thread-safety: immutable after
// Open; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvmesh::model {

// ggml's type ids as GGUF stores them (ggml.h's enum ggml_type).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

// Elements per block and bytes per block of a ggml type, or nullopt if kvmesh
// does not know the type's layout (the parser refuses such a tensor).
struct GgmlTypeLayout {
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
};
std::optional<GgmlTypeLayout> LayoutOf(uint32_t ggml_type);

// One metadata value. Arrays hold one vector of the element type; GGUF's
// nested arrays are accepted by the parser but kept only as a count.
struct GgufValue {
  enum class Type : uint32_t {
    kUInt8 = 0, kInt8 = 1, kUInt16 = 2, kInt16 = 3, kUInt32 = 4, kInt32 = 5, kFloat32 = 6,
    kBool = 7, kString = 8, kArray = 9, kUInt64 = 10, kInt64 = 11, kFloat64 = 12,
  };
  Type type = Type::kUInt8;
  // Scalars: integers widen to int64 (uint64 above INT64_MAX is refused), floats to double.
  std::variant<int64_t, double, bool, std::string> scalar;
  // Arrays: the element type and the elements of one of these, by element type.
  Type array_type = Type::kUInt8;
  uint64_t array_size = 0;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
};

struct GgufTensorInfo {
  std::string name;
  // GGUF order: dims[0] is the innermost (contiguous) dimension.
  std::vector<int64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;  // from the start of the data section
  int64_t num_elements = 0;
  int64_t num_bytes = 0;
  // Row-major shape, outermost first (dims reversed), as safetensors would list it.
  std::vector<int64_t> Shape() const { return {dims.rbegin(), dims.rend()}; }
};

class GgufFile {
 public:
  // NotFound if missing; DataLoss naming the file and key/tensor when truncated
  // or corrupt; InvalidArgument for a version or tensor type kvmesh cannot read.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes already in memory (tests); `path` names them in errors. The
  // bytes must outlive the file object.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::span<const uint8_t> bytes, const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const GgufValue* Find(const std::string& key) const;
  // Typed getters: NotFound naming the key when absent (only for the Required
  // forms), InvalidArgument naming the key and both types when mistyped.
  absl::StatusOr<std::optional<int64_t>> GetInt(const std::string& key) const;
  absl::StatusOr<std::optional<double>> GetFloat(const std::string& key) const;
  absl::StatusOr<std::optional<bool>> GetBool(const std::string& key) const;
  absl::StatusOr<std::optional<std::string>> GetString(const std::string& key) const;
  absl::StatusOr<int64_t> RequiredInt(const std::string& key) const;
  // An array of strings / of integers / of floats; nullptr when absent.
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(const std::string& key) const;
  absl::StatusOr<const std::vector<int64_t>*> GetIntArray(const std::string& key) const;
  absl::StatusOr<const std::vector<double>*> GetFloatArray(const std::string& key) const;
  const std::vector<std::string>& keys() const { return keys_; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // The tensor's bytes inside the mapping.
  std::span<const uint8_t> TensorData(const GgufTensorInfo& info) const {
    return {data_section_ + info.offset, static_cast<size_t>(info.num_bytes)};
  }

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  void* mapping_ = nullptr;  // owned mmap, or null for FromBytes
  std::span<const uint8_t> bytes_;
  const uint8_t* data_section_ = nullptr;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

// True when `path` names a GGUF file (ends in ".gguf"): the --model flag takes
// either a model directory or such a file.
bool IsGgufPath(const std::string& path);

}  // namespace kvmesh::model
