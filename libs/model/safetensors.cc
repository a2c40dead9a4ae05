#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvmesh::model {
namespace {

using Json = nlohmann::json;

// The safetensors format caps the header at 100 MB; a larger length field means corruption.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

constexpr char kIndexFileName[] = "model.safetensors.index.json";
constexpr char kSingleFileName[] = "model.safetensors";

// Safetensors dtype names kvmesh can hold; anything else is InvalidArgument.
std::optional<DType> SafetensorsDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kFP8E4M3;
  if (name == "I8") return DType::kInt8;
  if (name == "I32") return DType::kInt32;
  if (name == "I64") return DType::kInt64;
  if (name == "U8") return DType::kUInt8;
  if (name == "BOOL") return DType::kBool;
  return std::nullopt;
}

absl::Status ErrnoStatus(int err, const std::string& path, std::string_view what) {
  const std::string message = absl::StrCat(path, ": ", ToAbsl(what), ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Non-negative integer from a JSON number; false for anything else.
bool JsonToNonNegative(const Json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

// Validates one header entry (everything but overlaps) against a data section of
// `data_bytes`.
absl::StatusOr<SafetensorInfo> ParseTensorEntry(const std::string& path, const std::string& name, const Json& entry,
                                                int64_t data_bytes) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "'");
  if (!entry.is_object()) return absl::DataLossError(absl::StrCat(where, ": header entry is not a JSON object"));
  SafetensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return absl::DataLossError(absl::StrCat(where, ": header entry has no string \"dtype\""));
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  const std::optional<DType> dtype = SafetensorsDType(dtype_name);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unsupported dtype '", dtype_name, "' (supported: F32, BF16, F16, F8_E4M3, I8, I32, I64, U8, BOOL)"));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return absl::DataLossError(absl::StrCat(where, ": header entry has no \"shape\" array"));
  }
  if (shape_it->size() > static_cast<size_t>(kMaxTensorRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rank ", shape_it->size(), " exceeds the supported maximum ", kMaxTensorRank));
  }
  // Product of dims with overflow detection; byte length must equal end - begin.
  uint64_t num_elements = 1;
  bool overflow = false;
  for (const Json& d : *shape_it) {
    int64_t dim;
    if (!JsonToNonNegative(d, &dim)) {
      return absl::DataLossError(absl::StrCat(where, ": shape ", shape_it->dump(), " is not a list of sizes"));
    }
    info.shape.push_back(dim);
    if (dim != 0 && num_elements > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) overflow = true;
    num_elements *= static_cast<uint64_t>(dim);
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !JsonToNonNegative((*offsets_it)[0], &info.begin) || !JsonToNonNegative((*offsets_it)[1], &info.end)) {
    return absl::DataLossError(absl::StrCat(where, ": header entry has no \"data_offsets\" [begin, end]"));
  }
  if (info.begin > info.end || info.end > data_bytes) {
    return absl::DataLossError(absl::StrCat(where, ": data_offsets [", info.begin, ", ", info.end,
                                            "] outside the data section of ", data_bytes, " bytes"));
  }
  const uint64_t element_bytes = static_cast<uint64_t>(DTypeSize(info.dtype));
  if (overflow || num_elements > std::numeric_limits<uint64_t>::max() / element_bytes ||
      num_elements * element_bytes != static_cast<uint64_t>(info.end - info.begin)) {
    return absl::DataLossError(absl::StrCat(where, ": shape ", ShapeString(info.shape), " ", dtype_name, " needs ",
                                            overflow ? std::string("more than 2^64") : absl::StrCat(num_elements * element_bytes),
                                            " bytes but data_offsets [", info.begin, ", ", info.end, "] hold ",
                                            info.end - info.begin));
  }
  return info;
}

}  // namespace

// ---- SafetensorsFile ----

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", size, " bytes is too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) return ErrnoStatus(mmap_err, path, "mmap failed");
  file->mapping_ = mapping;
  file->size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(mapping);

  // 1. Header length: little-endian u64, header must lie within the file.
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or corrupt: header length ", header_bytes,
                                            " runs past the end of the file (", size, " bytes)"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt: header length ", header_bytes, " exceeds the 100 MB limit"));
  }
  // 2. Header: a JSON object (trailing spaces are the format's padding).
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const Json header = Json::parse(header_begin, header_begin + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: header (", header_bytes, " bytes) is not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: header is not a JSON object"));
  }
  file->data_section_ = bytes + 8 + header_bytes;
  const int64_t data_bytes = static_cast<int64_t>(size - 8 - header_bytes);

  // 3. Each tensor on its own, then overlaps among all of them.
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::DataLossError(absl::StrCat(path, ": corrupt: __metadata__ is not a JSON object"));
      }
      continue;
    }
    KVMESH_ASSIGN_OR_RETURN(SafetensorInfo info, ParseTensorEntry(path, name, entry, data_bytes));
    file->tensors_.push_back(std::move(info));
  }
  std::vector<const SafetensorInfo*> by_offset;
  for (const SafetensorInfo& t : file->tensors_) {
    if (t.end > t.begin) by_offset.push_back(&t);  // empty tensors occupy no bytes
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorInfo* a, const SafetensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorInfo& a = *by_offset[i - 1];
    const SafetensorInfo& b = *by_offset[i];
    if (b.begin < a.end) {
      return absl::DataLossError(absl::StrCat(path, ": corrupt: tensors '", a.name, "' [", a.begin, ", ", a.end,
                                              ") and '", b.name, "' [", b.begin, ", ", b.end, ") overlap"));
    }
  }
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_.emplace(file->tensors_[i].name, i);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", name, "'"));
  const SafetensorInfo& info = tensors_[it->second];
  TensorView view;
  // NOTE: the mapping is PROT_READ; the view's pointer is non-const only because
  // TensorView is shared with writable buffers. Writing through it faults.
  view.data = const_cast<uint8_t*>(data_section_ + info.begin);
  view.dtype = info.dtype;
  view.rank = static_cast<int>(info.shape.size());
  int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.shape[d] = info.shape[d];
    view.strides[d] = stride;
    stride *= info.shape[d];
  }
  return view;
}

// ---- SafetensorsStore ----

absl::StatusOr<std::unique_ptr<SafetensorsStore>> SafetensorsStore::Open(const std::string& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(model_dir, ": no such directory"));
  }
  auto store = std::unique_ptr<SafetensorsStore>(new SafetensorsStore());
  store->dir_ = model_dir;

  const std::string index_path = JoinPath(model_dir, kIndexFileName);
  if (FileExists(index_path)) {
    // Sharded: weight_map {tensor: shard file} is authoritative.
    KVMESH_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path));
    const Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": corrupt: not a JSON object"));
    }
    auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": corrupt: no \"weight_map\" object"));
    }
    std::map<std::string, std::vector<std::string>> tensors_by_shard;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return absl::DataLossError(
            absl::StrCat(index_path, ": corrupt: weight_map entry for tensor '", tensor, "' is not a file name"));
      }
      tensors_by_shard[shard.get<std::string>()].push_back(tensor);
    }
    for (const auto& [shard, tensors] : tensors_by_shard) {
      const std::string shard_path = JoinPath(model_dir, shard);
      auto file = SafetensorsFile::Open(shard_path);
      if (!file.ok()) {
        if (file.status().code() == absl::StatusCode::kNotFound) {
          return absl::NotFoundError(absl::StrCat(index_path, ": shard '", shard, "' (holding tensor '",
                                                  tensors.front(), "') is missing: ", file.status().message()));
        }
        return file.status();
      }
      for (const std::string& tensor : tensors) {
        if (!(*file)->Contains(tensor)) {
          return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", tensor, "' is mapped to shard '", shard,
                                                  "' but ", shard_path, " does not contain it"));
        }
        store->by_name_.emplace(tensor, file->get());
      }
      store->files_.push_back(*std::move(file));
    }
    return store;
  }

  std::vector<std::string> paths;
  const std::string single_path = JoinPath(model_dir, kSingleFileName);
  if (FileExists(single_path)) {
    paths.push_back(single_path);
  } else {
    for (const auto& entry : std::filesystem::directory_iterator(model_dir, ec)) {
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
    }
    if (ec) return absl::InternalError(absl::StrCat(model_dir, ": cannot list: ", ec.message()));
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) {
      return absl::NotFoundError(absl::StrCat(model_dir, ": no ", kIndexFileName, ", ", kSingleFileName,
                                              " or other *.safetensors file"));
    }
  }
  for (const std::string& path : paths) {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const SafetensorInfo& t : file->tensors()) {
      auto [it, inserted] = store->by_name_.emplace(t.name, file.get());
      if (!inserted) {
        return absl::DataLossError(absl::StrCat(model_dir, ": tensor '", t.name, "' appears in both ",
                                                it->second->path(), " and ", path));
      }
    }
    store->files_.push_back(std::move(file));
  }
  return store;
}

absl::StatusOr<TensorView> SafetensorsStore::Get(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found in checkpoint ", dir_));
  }
  return it->second->Get(name);
}

bool SafetensorsStore::Contains(const std::string& name) const { return by_name_.contains(name); }

std::string SafetensorsStore::FileOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? std::string() : it->second->path();
}

std::vector<std::string> SafetensorsStore::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, file] : by_name_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

int64_t SafetensorsStore::total_bytes() const {
  int64_t total = 0;
  for (const auto& file : files_) total += file->file_size_bytes();
  return total;
}

}  // namespace kvmesh::model
