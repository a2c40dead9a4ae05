#include "model/safetensors.h"

#include <cstdint>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "safetensors_test_util.h"

namespace kvmesh::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::FloatTensor;
using testing_util::FreshTestDir;
using testing_util::RawSafetensors;
using testing_util::SerializeSafetensors;
using testing_util::WriteBytes;

// True when [p, p + bytes) lies in a mapping of `path` (per /proc/self/maps).
bool IsMappedFrom(const void* p, int64_t bytes, const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, file;
    in >> range >> perms >> offset >> dev >> inode >> file;
    if (file != path) continue;
    const size_t dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (begin >= lo && begin + static_cast<uintptr_t>(bytes) <= hi) return true;
  }
  return false;
}

void ExpectError(const absl::Status& status, absl::StatusCode code, std::initializer_list<std::string> substrings) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& s : substrings) EXPECT_THAT(std::string(status.message()), HasSubstr(s)) << status;
}

// Writes `contents` to <fresh dir>/model.safetensors and opens it.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenBytes(const std::string& contents, std::string* path) {
  *path = FreshTestDir() + "/model.safetensors";
  WriteBytes(*path, contents);
  return SafetensorsFile::Open(*path);
}

constexpr char kEntry[] = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";

// ---- SafetensorsFile: happy paths ----

TEST(SafetensorsFileTest, OpensFloatTensorsAsViewsIntoTheMapping) {
  std::string path;
  auto file = OpenBytes(SerializeSafetensors({FloatTensor("a.f32", "F32", {2, 3}, 1.0f),
                                              FloatTensor("b.bf16", "BF16", {4}, 10.0f),
                                              FloatTensor("c.f16", "F16", {2, 1, 2}, -2.0f)}),
                        &path)
                  .value();
  EXPECT_EQ(file->path(), path);
  ASSERT_EQ(file->tensors().size(), 3u);

  const TensorView a = file->Get("a.f32").value();
  EXPECT_EQ(a.dtype, DType::kF32);
  ASSERT_EQ(a.rank, 2);
  EXPECT_EQ(a.dim(0), 2);
  EXPECT_EQ(a.dim(1), 3);
  EXPECT_EQ(a.strides[0], 3);
  EXPECT_EQ(a.strides[1], 1);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.data_as<const float>()[0], 1.0f);
  EXPECT_EQ(a.data_as<const float>()[5], 6.0f);

  const TensorView b = file->Get("b.bf16").value();
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(Bf16ToF32(b.data_as<const uint16_t>()[3]), 13.0f);

  const TensorView c = file->Get("c.f16").value();
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(F16ToF32(c.data_as<const uint16_t>()[0]), -2.0f);
  EXPECT_EQ(F16ToF32(c.data_as<const uint16_t>()[3]), 1.0f);

  // No copy: every view lies inside the file's mapping, consecutive tensors are
  // adjacent there, and a second Get returns the same address.
  for (const TensorView& v : {a, b, c}) EXPECT_TRUE(IsMappedFrom(v.data, v.num_bytes(), path));
  EXPECT_EQ(static_cast<const uint8_t*>(b.data), static_cast<const uint8_t*>(a.data) + 24);
  EXPECT_EQ(static_cast<const uint8_t*>(c.data), static_cast<const uint8_t*>(b.data) + 8);
  EXPECT_EQ(file->Get("a.f32").value().data, a.data);
  EXPECT_EQ(file->file_size_bytes(), static_cast<int64_t>(std::filesystem::file_size(path)));
}

TEST(SafetensorsFileTest, AcceptsMetadataScalarsEmptyTensorsAndIntegerDtypes) {
  // Offsets out of name order, a scalar, an empty tensor, ints and bools.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("z":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[8,8]},)"
                             R"("a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
                             R"("m":{"dtype":"BOOL","shape":[1],"data_offsets":[11,12]},)"
                             R"("q":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[12,14]},)"
                             R"("i":{"dtype":"I8","shape":[2],"data_offsets":[14,16]},)"
                             R"("j":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}})";
  std::string path;
  auto file = OpenBytes(RawSafetensors(header, std::string(20, '\x01')), &path).value();
  EXPECT_EQ(file->tensors().size(), 7u);
  const TensorView z = file->Get("z").value();
  EXPECT_EQ(z.rank, 0);
  EXPECT_EQ(z.num_elements(), 1);
  EXPECT_EQ(z.dtype, DType::kInt64);
  EXPECT_EQ(file->Get("empty").value().num_elements(), 0);
  EXPECT_EQ(file->Get("m").value().dtype, DType::kBool);
  EXPECT_EQ(file->Get("q").value().dtype, DType::kFP8E4M3);
  EXPECT_EQ(file->Get("i").value().dtype, DType::kInt8);
  EXPECT_EQ(file->Get("j").value().dtype, DType::kInt32);
  EXPECT_EQ(file->Get("a").value().dtype, DType::kUInt8);
}

// ---- SafetensorsFile: bad inputs ----

TEST(SafetensorsFileTest, MissingFileIsNotFound) {
  const std::string path = FreshTestDir() + "/absent.safetensors";
  ExpectError(SafetensorsFile::Open(path).status(), absl::StatusCode::kNotFound, {path});
}

TEST(SafetensorsFileTest, FileShorterThanHeaderLengthIsDataLoss) {
  std::string path;
  const auto file = OpenBytes("\x10\x00\x00", &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "truncated"});
}

TEST(SafetensorsFileTest, HeaderLengthPastEndOfFileIsDataLoss) {
  std::string path;
  const std::string header = std::string("{") + kEntry + "}";
  std::string bytes = RawSafetensors(header, std::string(16, '\0'));
  bytes[0] = static_cast<char>(0xff);  // header length now 255 + ...; file is shorter
  bytes[1] = static_cast<char>(0x7f);
  const auto file = OpenBytes(bytes, &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "header length", "past the end of the file"});
}

TEST(SafetensorsFileTest, TruncatedDataIsDataLossNamingTheTensor) {
  std::string path;
  const std::string full = SerializeSafetensors({FloatTensor("model.norm.weight", "F32", {8})});
  const auto file = OpenBytes(full.substr(0, full.size() - 5), &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "'model.norm.weight'", "data_offsets [0, 32]"});
}

TEST(SafetensorsFileTest, MalformedHeaderJsonIsDataLoss) {
  std::string path;
  const auto file = OpenBytes(RawSafetensors(R"({"w":{"dtype":"F32",)", std::string(16, '\0')), &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "not valid JSON"});

  const auto array = OpenBytes(RawSafetensors("[1,2,3]", ""), &path);
  ExpectError(array.status(), absl::StatusCode::kDataLoss, {path, "not a JSON object"});
}

TEST(SafetensorsFileTest, MalformedEntryIsDataLossNamingTheTensor) {
  std::string path;
  auto open = [&](const std::string& entry) {
    return OpenBytes(RawSafetensors("{\"w\":" + entry + "}", std::string(16, '\0')), &path).status();
  };
  ExpectError(open(R"({"shape":[4],"data_offsets":[0,16]})"), absl::StatusCode::kDataLoss, {"'w'", "dtype"});
  ExpectError(open(R"({"dtype":"F32","shape":[-4],"data_offsets":[0,16]})"), absl::StatusCode::kDataLoss,
              {path, "'w'", "shape"});
  ExpectError(open(R"({"dtype":"F32","shape":[4],"data_offsets":[0]})"), absl::StatusCode::kDataLoss,
              {path, "'w'", "data_offsets"});
  ExpectError(open(R"({"dtype":"F32","shape":[4],"data_offsets":[16,0]})"), absl::StatusCode::kDataLoss,
              {path, "'w'", "data_offsets [16, 0]"});
  ExpectError(open(R"([1])"), absl::StatusCode::kDataLoss, {path, "'w'"});
}

TEST(SafetensorsFileTest, OffsetsOutsideTheFileAreDataLoss) {
  std::string path;
  const auto file =
      OpenBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", std::string(16, '\0')),
                &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss,
              {path, "'w'", "data_offsets [8, 24]", "outside the data section of 16 bytes"});
}

TEST(SafetensorsFileTest, OverlappingTensorsAreDataLossNamingBoth) {
  std::string path;
  const auto file = OpenBytes(RawSafetensors(R"({"first":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                             R"("second":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                             std::string(16, '\0')),
                              &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "'first'", "'second'", "overlap"});
}

TEST(SafetensorsFileTest, ShapeTimesDtypeNotMatchingByteLengthIsDataLoss) {
  std::string path;
  const auto file =
      OpenBytes(RawSafetensors(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,16]}})", std::string(16, '\0')),
                &path);
  ExpectError(file.status(), absl::StatusCode::kDataLoss, {path, "'w'", "[2, 3]", "needs 12 bytes", "hold 16"});

  // A product that overflows 64 bits must not wrap around to a match.
  const auto huge = OpenBytes(
      RawSafetensors(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", ""), &path);
  ExpectError(huge.status(), absl::StatusCode::kDataLoss, {path, "'w'"});
}

TEST(SafetensorsFileTest, UnknownDtypeIsInvalidArgumentNamingTheTensor) {
  std::string path;
  const auto file =
      OpenBytes(RawSafetensors(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", std::string(16, '\0')),
                &path);
  ExpectError(file.status(), absl::StatusCode::kInvalidArgument, {path, "'w'", "unsupported dtype 'F64'"});
}

TEST(SafetensorsFileTest, MissingTensorIsNotFoundNamingFileAndTensor) {
  std::string path;
  auto file = OpenBytes(SerializeSafetensors({FloatTensor("w", "F32", {2})}), &path).value();
  ExpectError(file->Get("lm_head.weight").status(), absl::StatusCode::kNotFound, {path, "'lm_head.weight'"});
}

// ---- SafetensorsStore ----

std::string Index(const std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::string s = R"({"metadata":{"total_size":0},"weight_map":{)";
  for (size_t i = 0; i < weight_map.size(); ++i) {
    if (i) s += ",";
    s += "\"";
    s += weight_map[i].first;
    s += "\":\"";
    s += weight_map[i].second;
    s += "\"";
  }
  return s + "}}";
}

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

TEST(SafetensorsStoreTest, OpensShardedCheckpointThroughTheIndex) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/" + kShard1, SerializeSafetensors({FloatTensor("model.embed_tokens.weight", "BF16", {4, 2}),
                                                        FloatTensor("model.norm.weight", "BF16", {2}, 7.0f)}));
  WriteBytes(dir + "/" + kShard2, SerializeSafetensors({FloatTensor("lm_head.weight", "F16", {4, 2}, 3.0f)}));
  WriteBytes(dir + "/model.safetensors.index.json", Index({{"model.embed_tokens.weight", kShard1},
                                                           {"model.norm.weight", kShard1},
                                                           {"lm_head.weight", kShard2}}));
  auto store = SafetensorsStore::Open(dir).value();
  EXPECT_EQ(store->dir(), dir);
  EXPECT_THAT(store->TensorNames(), ElementsAre("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"));
  EXPECT_TRUE(store->Contains("model.norm.weight"));
  EXPECT_FALSE(store->Contains("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(store->FileOf("lm_head.weight"), dir + "/" + kShard2);
  EXPECT_EQ(store->FileOf("model.norm.weight"), dir + "/" + kShard1);
  EXPECT_EQ(store->FileOf("absent"), "");

  const TensorView lm_head = store->Get("lm_head.weight").value();
  EXPECT_EQ(lm_head.dtype, DType::kF16);
  EXPECT_EQ(F16ToF32(lm_head.data_as<const uint16_t>()[7]), 10.0f);
  EXPECT_TRUE(IsMappedFrom(lm_head.data, lm_head.num_bytes(), dir + "/" + kShard2));
  const TensorView norm = store->Get("model.norm.weight").value();
  EXPECT_EQ(Bf16ToF32(norm.data_as<const uint16_t>()[1]), 8.0f);
  EXPECT_TRUE(IsMappedFrom(norm.data, norm.num_bytes(), dir + "/" + kShard1));
  EXPECT_EQ(store->total_bytes(), static_cast<int64_t>(std::filesystem::file_size(dir + "/" + kShard1) +
                                                       std::filesystem::file_size(dir + "/" + kShard2)));

  ExpectError(store->Get("model.layers.0.mlp.up_proj.weight").status(), absl::StatusCode::kNotFound,
              {"'model.layers.0.mlp.up_proj.weight'", dir});
}

TEST(SafetensorsStoreTest, IndexNamingMissingShardIsNotFound) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/" + kShard1, SerializeSafetensors({FloatTensor("a", "F32", {2})}));
  WriteBytes(dir + "/model.safetensors.index.json", Index({{"a", kShard1}, {"b", kShard2}}));
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kNotFound,
              {"model.safetensors.index.json", kShard2, "'b'", "missing"});
}

TEST(SafetensorsStoreTest, TensorMissingFromItsShardIsNotFound) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/" + kShard1, SerializeSafetensors({FloatTensor("a", "F32", {2})}));
  WriteBytes(dir + "/" + kShard2, SerializeSafetensors({FloatTensor("c", "F32", {2})}));
  WriteBytes(dir + "/model.safetensors.index.json", Index({{"a", kShard1}, {"b", kShard2}}));
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kNotFound,
              {"model.safetensors.index.json", "'b'", std::string(dir + "/" + kShard2), "does not contain"});
}

TEST(SafetensorsStoreTest, CorruptIndexAndCorruptShardAreDataLoss) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/model.safetensors.index.json", R"({"weight_map": [1]})");
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kDataLoss,
              {"model.safetensors.index.json", "weight_map"});

  WriteBytes(dir + "/" + kShard1, RawSafetensors(R"({"a":{"dtype":"F32","shape":[9],"data_offsets":[0,36]}})", ""));
  WriteBytes(dir + "/model.safetensors.index.json", Index({{"a", kShard1}}));
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kDataLoss, {kShard1, "'a'"});
}

TEST(SafetensorsStoreTest, OpensSingleFileCheckpoint) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/model.safetensors", SerializeSafetensors({FloatTensor("w", "F32", {3}, 5.0f)}));
  auto store = SafetensorsStore::Open(dir).value();
  EXPECT_EQ(store->Get("w").value().data_as<const float>()[2], 7.0f);
  EXPECT_EQ(store->FileOf("w"), dir + "/model.safetensors");
}

TEST(SafetensorsStoreTest, FallsBackToEverySafetensorsFileAndRejectsDuplicates) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/part-a.safetensors", SerializeSafetensors({FloatTensor("x", "F32", {1})}));
  WriteBytes(dir + "/part-b.safetensors", SerializeSafetensors({FloatTensor("y", "F32", {1})}));
  auto store = SafetensorsStore::Open(dir).value();
  EXPECT_THAT(store->TensorNames(), ElementsAre("x", "y"));

  WriteBytes(dir + "/part-c.safetensors", SerializeSafetensors({FloatTensor("x", "F32", {1})}));
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kDataLoss,
              {"'x'", "part-a.safetensors", "part-c.safetensors"});
}

TEST(SafetensorsStoreTest, DirectoryWithoutCheckpointIsNotFound) {
  const std::string dir = FreshTestDir();
  ExpectError(SafetensorsStore::Open(dir).status(), absl::StatusCode::kNotFound, {dir, "safetensors"});
  ExpectError(SafetensorsStore::Open(dir + "/nope").status(), absl::StatusCode::kNotFound, {dir + "/nope"});
}

}  // namespace
}  // namespace kvmesh::model
