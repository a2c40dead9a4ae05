// Dequantization bit-exact against the `gguf` package: tests/data/gguf/ holds
// one tensor per supported type and the f32 values gguf.quants.dequantize gave
// for it (and those rounded to bf16), written by tools/make-gguf-fixtures.
#include "model/gguf_dequantize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/file_util.h"
#include "model/gguf_file.h"

namespace kvmesh::model {
namespace {

const std::string kDir = std::string(KVMESH_SOURCE_DIR) + "/tests/data/gguf/";

TEST(GgufDequantizeTest, EveryTypeIsBitExactWithTheGgufPackage) {
  auto index_text = ReadFileToString(kDir + "dequant-expected.json");
  ASSERT_TRUE(index_text.ok()) << index_text.status();
  const nlohmann::json index = nlohmann::json::parse(*index_text);
  auto expected = ReadFileToString(kDir + "dequant-expected.bin");
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto file = GgufFile::Open(kDir + "dequant.gguf");
  ASSERT_TRUE(file.ok()) << file.status();

  std::set<std::string> types;
  for (const auto& t : index["tensors"]) {
    const std::string name = t["name"];
    const GgufTensorInfo* info = (*file)->FindTensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(LayoutOf(info->type)->name, t["type"].get<std::string>()) << name;
    EXPECT_EQ(info->Shape(), t["shape"].get<std::vector<int64_t>>()) << name;
    const size_t n = t["elements"];
    std::vector<float> f32(n);
    ASSERT_TRUE(DequantizeToF32(info->type, (*file)->TensorData(*info), f32).ok()) << name;
    const size_t f32_offset = t["f32_offset"], bf16_offset = t["bf16_offset"];
    int f32_mismatch = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t want;
      uint32_t got;
      std::memcpy(&want, expected->data() + f32_offset + 4 * i, 4);
      std::memcpy(&got, &f32[i], 4);
      if (want != got && f32_mismatch++ < 5) {
        ADD_FAILURE() << name << " element " << i << ": got 0x" << std::hex << got << ", gguf gives 0x" << want;
      }
    }
    EXPECT_EQ(f32_mismatch, 0) << name << " f32 of " << n;
    std::vector<uint16_t> bf16(n);
    ASSERT_TRUE(DequantizeToBf16(info->type, (*file)->TensorData(*info), bf16).ok()) << name;
    EXPECT_EQ(std::memcmp(bf16.data(), expected->data() + bf16_offset, 2 * n), 0) << name << " bf16";
    types.insert(t["type"].get<std::string>());
  }
  EXPECT_EQ(types, (std::set<std::string>{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"}));
  std::printf("dequantization bit-exact with gguf.quants.dequantize for %zu types (f32 and bf16)\n", types.size());
}

TEST(GgufDequantizeTest, RefusesUnsupportedTypesAndWrongSizes) {
  std::vector<uint8_t> bytes(34 * 2);
  std::vector<float> out(64);
  EXPECT_TRUE(DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ8_0), bytes, out).ok());
  const absl::Status q2k = DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ2_K), bytes, out);
  EXPECT_EQ(q2k.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q2k.message().find("Q2_K"), std::string::npos) << q2k;
  std::vector<float> odd(63);
  EXPECT_FALSE(DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ8_0), bytes, odd).ok());
  std::vector<uint8_t> short_bytes(34);
  const absl::Status s = DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ8_0), short_bytes, out);
  EXPECT_NE(s.message().find("take 68 bytes"), std::string::npos) << s;
  EXPECT_FALSE(DequantizeToF32(99, bytes, out).ok());
}

}  // namespace
}  // namespace kvmesh::model
