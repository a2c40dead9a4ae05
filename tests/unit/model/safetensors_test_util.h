// Test helpers: write small safetensors files (and raw, deliberately broken ones)
// into a fresh directory under testing::TempDir().
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace kvmesh::model::testing_util {

struct TestTensor {
  std::string name;
  std::string dtype;  // safetensors name: "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian payload
};

inline int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Payload whose element i is `base + i` in the given float dtype.
inline std::string FloatBytes(const std::string& dtype, int64_t n, float base = 0.0f) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const float v = base + static_cast<float>(i);
    if (dtype == "F32") {
      char b[4];
      std::memcpy(b, &v, 4);
      out.append(b, 4);
    } else {
      const uint16_t h = dtype == "BF16" ? F32ToBf16(v) : F32ToF16(v);
      out.push_back(static_cast<char>(h & 0xff));
      out.push_back(static_cast<char>(h >> 8));
    }
  }
  return out;
}

inline TestTensor FloatTensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                              float base = 0.0f) {
  const int64_t n = NumElements(shape);
  return TestTensor{name, dtype, std::move(shape), FloatBytes(dtype, n, base)};
}

inline std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// The 8-byte length, `header` verbatim, then `data`.
inline std::string RawSafetensors(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

inline std::string ShapeJson(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// A well-formed file: tensors packed in order, header padded with spaces to 8 bytes
// as the Python writer does.
inline std::string SerializeSafetensors(const std::vector<TestTensor>& tensors, bool with_metadata = true) {
  std::string header = "{";
  if (with_metadata) header += "\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const TestTensor& t : tensors) {
    if (header.size() > 1) header += ",";
    const size_t begin = data.size();
    data += t.bytes;
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + ShapeJson(t.shape) +
              ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  return RawSafetensors(header, data);
}

inline void WriteBytes(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A fresh, empty directory named after the running test.
inline std::string FreshTestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    (std::string("kvmesh_") + info->test_suite_name() + "_" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace kvmesh::model::testing_util
