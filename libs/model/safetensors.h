// Read-only access to Hugging Face safetensors checkpoints, memory-mapped.
//
// SafetensorsFile maps one file and validates its header strictly: JSON header
// within the file, every tensor's dtype known, data_offsets in range and
// ordered, shape x dtype size == byte length, no two tensors overlapping.
// SafetensorsStore opens a model directory: `model.safetensors`, or every shard
// listed in `model.safetensors.index.json`, and finds tensors by name.
//
// Views returned point into the mapping: no copy is made, and they stay valid
// while the file/store lives. Thread-safety: immutable after Open; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/tensor_view.h"

namespace kvmesh::model {

struct SafetensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets into the data section
  int64_t end = 0;
};

class SafetensorsFile {
 public:
  // NotFound if missing; DataLoss (naming the file and tensor) on a truncated
  // or corrupt file; InvalidArgument on an unsupported dtype.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorInfo>& tensors() const { return tensors_; }
  // NotFound naming the file if absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  bool Contains(const std::string& name) const { return index_.contains(name); }
  int64_t file_size_bytes() const { return static_cast<int64_t>(size_); }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::vector<SafetensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
};

class SafetensorsStore {
 public:
  // Opens model.safetensors.index.json's shards if present, else model.safetensors,
  // else every *.safetensors in the directory. Errors name the file.
  static absl::StatusOr<std::unique_ptr<SafetensorsStore>> Open(const std::string& model_dir);

  // NotFound naming the tensor (and the directory) if absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  bool Contains(const std::string& name) const;
  // The file that holds `name` (for error messages); empty if absent.
  std::string FileOf(const std::string& name) const;
  std::vector<std::string> TensorNames() const;
  int64_t total_bytes() const;
  // The directory Open() was given (for error messages).
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const SafetensorsFile*> by_name_;
};

}  // namespace kvmesh::model
