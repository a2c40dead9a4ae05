#include "model/model_weights.h"

#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "safetensors_test_util.h"

namespace kvmesh::model {
namespace {

using ::testing::HasSubstr;
using testing_util::FloatTensor;
using testing_util::FreshTestDir;
using testing_util::SerializeSafetensors;
using testing_util::TestTensor;
using testing_util::WriteBytes;

// A tiny Llama: vocab 32, hidden 8, 2 heads of 4, 1 KV head, MLP 12, 2 layers.
constexpr int64_t kVocab = 32, kHidden = 8, kHeads = 2, kKvHeads = 1, kHeadDim = 4, kInter = 12, kLayers = 2;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.intermediate_size = kInter;
  c.num_hidden_layers = kLayers;
  c.num_attention_heads = kHeads;
  c.num_key_value_heads = kKvHeads;
  c.head_dim = kHeadDim;
  return c;
}

struct TinyOptions {
  std::string dtype = "F32";
  bool biases = false;
  bool lm_head = true;
};

// Every tensor of the tiny model, each with distinct values.
std::vector<TestTensor> TinyTensors(const TinyOptions& o) {
  std::vector<TestTensor> t;
  float base = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    t.push_back(FloatTensor(name, o.dtype, shape, base));
    base += 1000;
  };
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {kHidden});
    add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
    add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
    if (o.biases) {
      add(p + "self_attn.q_proj.bias", {kHeads * kHeadDim});
      add(p + "self_attn.k_proj.bias", {kKvHeads * kHeadDim});
      add(p + "self_attn.v_proj.bias", {kKvHeads * kHeadDim});
    }
    add(p + "post_attention_layernorm.weight", {kHidden});
    add(p + "mlp.gate_proj.weight", {kInter, kHidden});
    add(p + "mlp.up_proj.weight", {kInter, kHidden});
    add(p + "mlp.down_proj.weight", {kHidden, kInter});
  }
  add("model.norm.weight", {kHidden});
  if (o.lm_head) add("lm_head.weight", {kVocab, kHidden});
  return t;
}

// Writes `tensors` as <fresh dir>/model.safetensors; returns the dir.
std::string WriteTiny(const std::vector<TestTensor>& tensors) {
  const std::string dir = FreshTestDir();
  WriteBytes(dir + "/model.safetensors", SerializeSafetensors(tensors));
  return dir;
}

std::vector<TestTensor> Without(std::vector<TestTensor> tensors, const std::string& name) {
  std::erase_if(tensors, [&](const TestTensor& t) { return t.name == name; });
  return tensors;
}

std::vector<TestTensor> Replaced(std::vector<TestTensor> tensors, const TestTensor& replacement) {
  for (TestTensor& t : tensors) {
    if (t.name == replacement.name) t = replacement;
  }
  return tensors;
}

void ExpectShape(const TensorView& v, std::vector<int64_t> shape) {
  ASSERT_EQ(v.rank, static_cast<int>(shape.size())) << v.DebugString();
  for (int i = 0; i < v.rank; ++i) EXPECT_EQ(v.dim(i), shape[i]) << v.DebugString();
}

void ExpectInvalid(const absl::StatusOr<ModelWeights>& w, std::initializer_list<std::string> substrings) {
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  for (const std::string& s : substrings) EXPECT_THAT(std::string(w.status().message()), HasSubstr(s));
}

TEST(ModelWeightsTest, BindsEveryRoleToViewsIntoTheStore) {
  const std::string dir = WriteTiny(TinyTensors({}));
  auto store = SafetensorsStore::Open(dir).value();
  const ModelWeights w = BindModelWeights(TinyConfig(), *store).value();
  ExpectShape(w.embed_tokens, {kVocab, kHidden});
  ExpectShape(w.norm, {kHidden});
  ExpectShape(w.lm_head, {kVocab, kHidden});
  EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(kLayers));
  const LayerWeights& l = w.layers[1];
  ExpectShape(l.input_layernorm, {kHidden});
  ExpectShape(l.q_proj, {kHeads * kHeadDim, kHidden});
  ExpectShape(l.k_proj, {kKvHeads * kHeadDim, kHidden});
  ExpectShape(l.v_proj, {kKvHeads * kHeadDim, kHidden});
  ExpectShape(l.o_proj, {kHidden, kHeads * kHeadDim});
  ExpectShape(l.post_attention_layernorm, {kHidden});
  ExpectShape(l.gate_proj, {kInter, kHidden});
  ExpectShape(l.up_proj, {kInter, kHidden});
  ExpectShape(l.down_proj, {kHidden, kInter});
  EXPECT_FALSE(l.q_bias.has_value());
  EXPECT_FALSE(l.o_bias.has_value());
  // Same addresses as the store's views: bound, not copied.
  EXPECT_EQ(l.down_proj.data, store->Get("model.layers.1.mlp.down_proj.weight").value().data);
  EXPECT_EQ(w.norm.data, store->Get("model.norm.weight").value().data);
  EXPECT_NE(w.layers[0].q_proj.data, w.layers[1].q_proj.data);
}

TEST(ModelWeightsTest, TiedEmbeddingsUseTheEmbeddingForLmHead) {
  ModelConfig config = TinyConfig();
  config.tie_word_embeddings = true;
  {
    auto store = SafetensorsStore::Open(WriteTiny(TinyTensors({.lm_head = false}))).value();
    const ModelWeights w = BindModelWeights(config, *store).value();
    EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
    ExpectShape(w.lm_head, {kVocab, kHidden});
  }
  {
    // A checkpoint that also carries lm_head.weight: tied still means the embedding.
    auto store = SafetensorsStore::Open(WriteTiny(TinyTensors({}))).value();
    const ModelWeights w = BindModelWeights(config, *store).value();
    EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  }
}

TEST(ModelWeightsTest, Qwen2BiasesAreBoundInBf16) {
  ModelConfig config = TinyConfig();
  config.architecture = Architecture::kQwen2;
  config.attention_bias = true;
  auto store = SafetensorsStore::Open(WriteTiny(TinyTensors({.dtype = "BF16", .biases = true}))).value();
  const ModelWeights w = BindModelWeights(config, *store).value();
  for (const LayerWeights& l : w.layers) {
    ASSERT_TRUE(l.q_bias && l.k_bias && l.v_bias);
    ExpectShape(*l.q_bias, {kHeads * kHeadDim});
    ExpectShape(*l.k_bias, {kKvHeads * kHeadDim});
    ExpectShape(*l.v_bias, {kKvHeads * kHeadDim});
    EXPECT_EQ(l.q_bias->dtype, DType::kBF16);
    EXPECT_FALSE(l.o_bias.has_value());
  }
  EXPECT_EQ(w.embed_tokens.dtype, DType::kBF16);
}

TEST(ModelWeightsTest, BindsF16ShardedCheckpoint) {
  const std::vector<TestTensor> all = TinyTensors({.dtype = "F16"});
  const std::string dir = FreshTestDir();
  const std::vector<TestTensor> first(all.begin(), all.begin() + all.size() / 2);
  const std::vector<TestTensor> second(all.begin() + all.size() / 2, all.end());
  WriteBytes(dir + "/model-00001-of-00002.safetensors", SerializeSafetensors(first));
  WriteBytes(dir + "/model-00002-of-00002.safetensors", SerializeSafetensors(second));
  std::string index = R"({"weight_map":{)";
  for (size_t i = 0; i < all.size(); ++i) {
    if (i) index += ",";
    index += "\"" + all[i].name + "\":\"model-0000";
    index += i < first.size() ? "1" : "2";
    index += "-of-00002.safetensors\"";
  }
  index += "}}";
  WriteBytes(dir + "/model.safetensors.index.json", index);
  auto store = SafetensorsStore::Open(dir).value();
  const ModelWeights w = BindModelWeights(TinyConfig(), *store).value();
  EXPECT_EQ(w.lm_head.dtype, DType::kF16);
  EXPECT_EQ(w.embed_tokens.dtype, DType::kF16);
  EXPECT_EQ(F16ToF32(w.embed_tokens.data_as<const uint16_t>()[5]), 5.0f);
}

TEST(ModelWeightsTest, MissingTensorIsInvalidArgumentNamingTensorAndExpectedShape) {
  const std::string dir = WriteTiny(Without(TinyTensors({}), "model.layers.1.mlp.up_proj.weight"));
  auto store = SafetensorsStore::Open(dir).value();
  ExpectInvalid(BindModelWeights(TinyConfig(), *store),
                {"'model.layers.1.mlp.up_proj.weight'", "missing", dir, "expected shape [12, 8]"});
}

TEST(ModelWeightsTest, MisShapedTensorIsInvalidArgumentNamingFileExpectedAndFound) {
  // k_proj written as if there were 2 KV heads.
  const std::string dir =
      WriteTiny(Replaced(TinyTensors({}), FloatTensor("model.layers.0.self_attn.k_proj.weight", "F32", {8, 8})));
  auto store = SafetensorsStore::Open(dir).value();
  ExpectInvalid(BindModelWeights(TinyConfig(), *store),
                {"'model.layers.0.self_attn.k_proj.weight'", dir + "/model.safetensors", "expected shape [4, 8]",
                 "found [8, 8]"});

  const std::string dir2 = WriteTiny(Replaced(TinyTensors({}), FloatTensor("model.norm.weight", "F32", {1, 8})));
  auto store2 = SafetensorsStore::Open(dir2).value();
  ExpectInvalid(BindModelWeights(TinyConfig(), *store2), {"'model.norm.weight'", "expected shape [8]", "found [1, 8]"});
}

TEST(ModelWeightsTest, UntiedCheckpointWithoutLmHeadIsInvalid) {
  auto store = SafetensorsStore::Open(WriteTiny(TinyTensors({.lm_head = false}))).value();
  ExpectInvalid(BindModelWeights(TinyConfig(), *store), {"'lm_head.weight'", "missing", "expected shape [32, 8]"});
}

TEST(ModelWeightsTest, MissingBiasWithAttentionBiasIsInvalid) {
  ModelConfig config = TinyConfig();
  config.attention_bias = true;
  auto store = SafetensorsStore::Open(WriteTiny(TinyTensors({}))).value();
  ExpectInvalid(BindModelWeights(config, *store), {"'model.layers.0.self_attn.q_proj.bias'", "expected shape [8]"});
}

TEST(ModelWeightsTest, NonFloatDtypeIsInvalid) {
  TestTensor int_norm{"model.norm.weight", "I32", {kHidden}, std::string(kHidden * 4, '\0')};
  auto store = SafetensorsStore::Open(WriteTiny(Replaced(TinyTensors({}), int_norm))).value();
  ExpectInvalid(BindModelWeights(TinyConfig(), *store), {"'model.norm.weight'", "model.safetensors", "int32"});
}

}  // namespace
}  // namespace kvmesh::model
