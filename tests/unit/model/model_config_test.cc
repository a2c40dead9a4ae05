#include "model/model_config.h"

#include <bit>
#include <cstdlib>
#include <filesystem>
#include <span>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "safetensors_test_util.h"

namespace kvmesh::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kPath[] = "/models/x/config.json";

// Llama-2-7b-hf's config.json.
Json Llama2() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

// Llama-3.1-8B-Instruct's config.json.
Json Llama31() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})");
}

// Mistral-7B-v0.1's config.json.
Json Mistral() {
  return Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

// Qwen2-0.5B-Instruct's config.json.
Json Qwen2() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), kPath); }

void ExpectInvalid(const Json& j, std::initializer_list<std::string> substrings) {
  const auto config = Parse(j);
  ASSERT_FALSE(config.ok()) << j.dump();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(kPath));
  for (const std::string& s : substrings) EXPECT_THAT(std::string(config.status().message()), HasSubstr(s));
}

TEST(ModelConfigTest, ParsesLlama2) {
  const ModelConfig c = Parse(Llama2()).value();
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, DType::kF16);
  EXPECT_THAT(c.bos_token_ids, ElementsAre(1));
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_FALSE(c.sliding_window.has_value());
}

TEST(ModelConfigTest, ParsesLlama31WithLlama3RopeAndEosList) {
  const ModelConfig c = Parse(Llama31()).value();
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_THAT(c.bos_token_ids, ElementsAre(128000));
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ModelConfigTest, ParsesMistralSlidingWindow) {
  const ModelConfig c = Parse(Mistral()).value();
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.attention_bias);
}

TEST(ModelConfigTest, Qwen2AlwaysHasAttentionBiasAndHonoursUseSlidingWindow) {
  const ModelConfig c = Parse(Qwen2()).value();
  EXPECT_EQ(c.architecture, Architecture::kQwen2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window: false
  Json j = Qwen2();
  j["attention_bias"] = false;  // ignored: Qwen2 q/k/v always carry a bias
  EXPECT_TRUE(Parse(j).value().attention_bias);
}

TEST(ModelConfigTest, DefaultsKvHeadsAndHeadDim) {
  Json j = Llama2();
  j.erase("num_key_value_heads");
  j["num_key_value_heads"] = nullptr;
  const ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
}

TEST(ModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  Json j = Llama2();
  j["hidden_size"] = 1000;  // 32 does not divide 1000, but head_dim is given
  j["head_dim"] = 64;
  const ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.head_dim, 64);
}

TEST(ModelConfigTest, ArchitectureFromArchitecturesWhenModelTypeAbsent) {
  Json j = Mistral();
  j.erase("model_type");
  EXPECT_EQ(Parse(j).value().architecture, Architecture::kMistral);
}

TEST(ModelConfigTest, RopeScalingAcceptsTypeKeyDefaultAndLinear) {
  Json j = Llama2();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig c = Parse(j).value();
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 2.0f);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(Parse(j).value().rope_scaling.type, RopeScalingType::kNone);
  j["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(Parse(j).value().rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, EosTokenIdMayBeAbsentOrNull) {
  Json j = Llama2();
  j["eos_token_id"] = nullptr;
  j.erase("bos_token_id");
  const ModelConfig c = Parse(j).value();
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_TRUE(c.bos_token_ids.empty());
}

// ---- errors ----

TEST(ModelConfigTest, HeadsNotDividingHiddenIsInvalid) {
  Json j = Llama2();
  j["hidden_size"] = 4000;
  j["num_attention_heads"] = 7;
  j["num_key_value_heads"] = 7;
  ExpectInvalid(j, {"num_attention_heads (7)", "hidden_size (4000)"});
}

TEST(ModelConfigTest, KvHeadsNotDividingHeadsIsInvalid) {
  Json j = Llama31();
  j["num_key_value_heads"] = 5;
  ExpectInvalid(j, {"num_key_value_heads (5)", "num_attention_heads (32)"});
}

TEST(ModelConfigTest, MissingKeyIsInvalid) {
  Json j = Llama2();
  j.erase("intermediate_size");
  ExpectInvalid(j, {"missing", "intermediate_size"});
}

TEST(ModelConfigTest, WrongTypeIsInvalid) {
  Json j = Llama2();
  j["hidden_size"] = "4096";
  ExpectInvalid(j, {"hidden_size", "must be an integer", "string"});
  j = Llama2();
  j["rms_norm_eps"] = "tiny";
  ExpectInvalid(j, {"rms_norm_eps", "must be a number"});
  j = Llama2();
  j["tie_word_embeddings"] = 1;
  ExpectInvalid(j, {"tie_word_embeddings", "must be a boolean"});
  j = Llama2();
  j["eos_token_id"] = "</s>";
  ExpectInvalid(j, {"eos_token_id"});
  j = Llama2();
  j["rope_scaling"] = 8;
  ExpectInvalid(j, {"rope_scaling", "must be an object"});
}

TEST(ModelConfigTest, NonPositiveSizeIsInvalid) {
  Json j = Llama2();
  j["num_hidden_layers"] = 0;
  ExpectInvalid(j, {"num_hidden_layers", "must be positive"});
  j = Llama2();
  j["vocab_size"] = -1;
  ExpectInvalid(j, {"vocab_size", "must be positive"});
}

TEST(ModelConfigTest, UnknownRopeScalingTypeIsInvalid) {
  Json j = Llama2();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  ExpectInvalid(j, {"rope_scaling.type", "'yarn'", "not supported"});
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  ExpectInvalid(j, {"'dynamic'"});
}

TEST(ModelConfigTest, Llama3RopeScalingMissingFieldIsInvalid) {
  Json j = Llama31();
  j["rope_scaling"].erase("original_max_position_embeddings");
  ExpectInvalid(j, {"rope_scaling.original_max_position_embeddings"});
  j = Llama31();
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectInvalid(j, {"rope_scaling.high_freq_factor"});
}

TEST(ModelConfigTest, MalformedJsonAndUnsupportedModelTypeAreInvalid) {
  const auto bad = ParseModelConfig("{\"hidden_size\": 4096,", kPath);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), AllOf(HasSubstr(kPath), HasSubstr("malformed JSON")));
  const auto array = ParseModelConfig("[1, 2]", kPath);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  Json j = Llama2();
  j["model_type"] = "gpt2";
  ExpectInvalid(j, {"model_type", "'gpt2'"});
}

TEST(ModelConfigTest, LoadsFromDirectoryAndReportsMissingFile) {
  const std::string dir = testing_util::FreshTestDir();
  testing_util::WriteBytes(dir + "/config.json", Mistral().dump(2));
  const ModelConfig c = LoadModelConfig(dir).value();
  EXPECT_EQ(c.architecture, Architecture::kMistral);

  const std::string empty = dir + "/nothing_here";
  std::filesystem::create_directories(empty);
  const auto missing = LoadModelConfig(empty);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("config.json"));
}

// ---- RoPE inverse frequencies ----
//
// Expected values: transformers 5.24 / torch 2.15 (CPU, AVX512), LlamaRotaryEmbedding(config).inv_freq
// for the config in each comment. torch computes `base ** exponent` with SLEEF's powf (error
// <= 1 ulp), kvmesh with the correctly rounded pow, so single elements may differ by 1 ulp;
// everything after the pow follows torch's f32 ops exactly.

// Llama2Default: hidden_size=4096, num_attention_heads=32, rope_theta=10000, rope_scaling=None
constexpr uint32_t kLlama2Default[] = {
    0x3f800000u, 0x3f5dafd7u, 0x3f3ff911u, 0x3f263de0u, 0x3f0ff59au, 0x3ef953cfu, 0x3ed7e89bu, 0x3ebaf81bu,
    0x3ea1e89bu, 0x3e8c3504u, 0x3e72d423u, 0x3e5247edu, 0x3e361887u, 0x3e1db040u, 0x3e088d77u, 0x3dec7fd6u,
    0x3dcccccdu, 0x3db15978u, 0x3d99940du, 0x3d84fe4du, 0x3d6655c2u, 0x3d47763fu, 0x3d2cba15u, 0x3d159348u,
    0x3d0186e3u, 0x3ce054d2u, 0x3cc2434fu, 0x3ca8398bu, 0x3c91ad39u, 0x3c7c4d33u, 0x3c5a7bf2u, 0x3c3d3311u,
    0x3c23d70au, 0x3c0de12du, 0x3bf5b9b0u, 0x3bd4ca15u, 0x3bb8449cu, 0x3b9f91ccu, 0x3b8a2e77u, 0x3b6f520eu,
    0x3b4f3e38u, 0x3b33770fu, 0x3b1b690du, 0x3b06946fu, 0x3ae91528u, 0x3ac9d75cu, 0x3aaec98eu, 0x3a975c0eu,
    0x3a83126fu, 0x3a6301e2u, 0x3a44948cu, 0x3a2a3b44u, 0x3a136a16u, 0x39ff4facu, 0x39dd1725u, 0x39bf74d7u,
    0x39a5cb60u, 0x398f9272u, 0x3978a815u, 0x395753e4u, 0x393a7753u, 0x39217916u, 0x390bd472u, 0x38f22ce2u,
};
// Llama31Llama3: hidden_size=4096, heads=32, rope_theta=500000, rope_scaling={llama3, factor 8,
// low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192}
constexpr uint32_t kLlama31Llama3[] = {
    0x3f800000u, 0x3f508ac1u, 0x3f29e1c6u, 0x3f0a6384u, 0x3ee177bcu, 0x3eb7ab7du, 0x3e959ee3u, 0x3e73c461u,
    0x3e4693b0u, 0x3e21c3a0u, 0x3e03c6a0u, 0x3dd6b19cu, 0x3daee4adu, 0x3d8e7898u, 0x3d681e67u, 0x3d3d1684u,
    0x3d1a08c8u, 0x3cfaf53fu, 0x3ccc6f49u, 0x3ca68939u, 0x3c87a9c3u, 0x3c5d06ecu, 0x3c340d6du, 0x3c12ac7fu,
    0x3beef74fu, 0x3bc2aa76u, 0x3b9e9402u, 0x3b812e35u, 0x3b527720u, 0x3b0dfd06u, 0x3ab3d11du, 0x3a60979eu,
    0x3a0995d2u, 0x39a3f108u, 0x393b2dd2u, 0x38c86886u, 0x38a3418du, 0x3884fdbfu, 0x3858ac81u, 0x38308199u,
    0x380fc8f8u, 0x37ea426fu, 0x37bed4f4u, 0x379b7475u, 0x377d45c3u, 0x374e51f5u, 0x3728126bu, 0x3708ea0fu,
    0x36df10c4u, 0x36b5b687u, 0x369406cbu, 0x36712b80u, 0x36447610u, 0x36200a69u, 0x36025f34u, 0x35d46808u,
    0x35ad07a7u, 0x358cf400u, 0x3565a54du, 0x353b12c7u, 0x351864a7u, 0x34f848c2u, 0x34ca41b0u, 0x34a4c2ffu,
};
// Llama32Llama3: hidden_size=2048, heads=32, rope_theta=500000, rope_scaling={llama3, factor 32,
// low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192}
constexpr uint32_t kLlama32Llama3[] = {
    0x3f800000u, 0x3f29e1c6u, 0x3ee177bcu, 0x3e959ee3u, 0x3e4693b0u, 0x3e03c6a0u, 0x3daee4adu, 0x3d681e67u,
    0x3d1a08c8u, 0x3ccc6f49u, 0x3c87a9c3u, 0x3c340d6du, 0x3beef74fu, 0x3b9e9402u, 0x3b527720u, 0x3aa9279bu,
    0x39e13620u, 0x38cb98f7u, 0x37a3418du, 0x3758ac81u, 0x370fc8f8u, 0x36bed4f4u, 0x367d45c3u, 0x3628126bu,
    0x35df10c4u, 0x359406cbu, 0x35447610u, 0x35025f34u, 0x34ad07a7u, 0x3465a54du, 0x341864a7u, 0x33ca41b0u,
};
// Linear: hidden_size=1024, heads=16, rope_theta=10000, rope_scaling={type linear, factor 4}
constexpr uint32_t kLinear[] = {
    0x3e800000u, 0x3e3ff911u, 0x3e0ff59au, 0x3dd7e89bu, 0x3da1e89bu, 0x3d72d423u, 0x3d361887u, 0x3d088d77u,
    0x3ccccccdu, 0x3c99940du, 0x3c6655c2u, 0x3c2cba15u, 0x3c0186e3u, 0x3bc2434fu, 0x3b91ad39u, 0x3b5a7bf2u,
    0x3b23d70au, 0x3af5b9b0u, 0x3ab8449cu, 0x3a8a2e77u, 0x3a4f3e38u, 0x3a1b690du, 0x39e91528u, 0x39aec98eu,
    0x3983126fu, 0x3944948cu, 0x39136a16u, 0x38dd1725u, 0x38a5cb60u, 0x3878a815u, 0x383a7753u, 0x380bd472u,
};
// Qwen2Default: hidden_size=3584, heads=28, rope_theta=1e6, rope_scaling=None
constexpr uint32_t kQwen2Default[] = {
    0x3f800000u, 0x3f4e4badu, 0x3f263de0u, 0x3f05f6efu, 0x3ed7e89bu, 0x3eadfcffu, 0x3e8c3504u, 0x3e61f835u,
    0x3e361887u, 0x3e12bd91u, 0x3dec7fd6u, 0x3dbe94c6u, 0x3d99940du, 0x3d778513u, 0x3d47763fu, 0x3d20bc1du,
    0x3d0186e3u, 0x3cd0c1a8u, 0x3ca8398bu, 0x3c879008u, 0x3c5a7bf2u, 0x3c301052u, 0x3c0de12du, 0x3be4aa46u,
    0x3bb8449cu, 0x3b947daeu, 0x3b6f520eu, 0x3b40dac5u, 0x3b1b690du, 0x3afa78f0u, 0x3ac9d75cu, 0x3aa2a6f7u,
    0x3a83126fu, 0x3a533f28u, 0x3a2a3b44u, 0x3a092e02u, 0x39dd1725u, 0x39b229fbu, 0x398f9272u, 0x39676492u,
    0x393a7753u, 0x39164324u, 0x38f22ce2u, 0x38c327b5u, 0x389d43a4u, 0x387d75d4u, 0x384c3fbeu, 0x382497abu,
    0x3804a2b2u, 0x37d5c441u, 0x37ac431du, 0x378ad0edu, 0x375fba4fu, 0x37344a0eu, 0x371148e3u, 0x36ea2732u,
    0x36bcb0c1u, 0x36980e02u, 0x36751070u, 0x36457babu, 0x361f23e4u, 0x36003decu, 0x35ceaf79u, 0x35a68e4cu,
};

// Compares bit patterns: every element within `max_ulps`, and at most `max_inexact` not exact.
void ExpectInvFreq(const ModelConfig& c, std::span<const uint32_t> expected, int max_inexact) {
  const std::vector<float> got = c.RopeInverseFrequencies();
  ASSERT_EQ(got.size(), expected.size());
  int inexact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t diff = static_cast<int64_t>(std::bit_cast<uint32_t>(got[i])) - static_cast<int64_t>(expected[i]);
    EXPECT_LE(std::llabs(diff), 1) << "element " << i << ": got " << got[i] << " expected "
                                   << std::bit_cast<float>(expected[i]);
    if (diff != 0) ++inexact;
  }
  EXPECT_LE(inexact, max_inexact);
}

ModelConfig RopeConfig(int64_t hidden, int64_t heads, float theta, RopeScaling scaling) {
  ModelConfig c;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.head_dim = hidden / heads;
  c.rope_theta = theta;
  c.rope_scaling = scaling;
  return c;
}

TEST(ModelConfigRopeTest, DefaultMatchesTransformers) {
  ExpectInvFreq(RopeConfig(4096, 32, 10000.0f, {}), kLlama2Default, /*max_inexact=*/0);
  ExpectInvFreq(RopeConfig(3584, 28, 1000000.0f, {}), kQwen2Default, /*max_inexact=*/1);
}

TEST(ModelConfigRopeTest, Llama3ScalingMatchesTransformers) {
  const RopeScaling llama31{.type = RopeScalingType::kLlama3,
                            .factor = 8.0f,
                            .low_freq_factor = 1.0f,
                            .high_freq_factor = 4.0f,
                            .original_max_position_embeddings = 8192};
  ExpectInvFreq(RopeConfig(4096, 32, 500000.0f, llama31), kLlama31Llama3, /*max_inexact=*/0);
  RopeScaling llama32 = llama31;
  llama32.factor = 32.0f;
  ExpectInvFreq(RopeConfig(2048, 32, 500000.0f, llama32), kLlama32Llama3, /*max_inexact=*/0);
}

TEST(ModelConfigRopeTest, LinearScalingMatchesTransformers) {
  ExpectInvFreq(RopeConfig(1024, 16, 10000.0f, {.type = RopeScalingType::kLinear, .factor = 4.0f}), kLinear,
                /*max_inexact=*/0);
}

TEST(ModelConfigRopeTest, ParsedLlama31ConfigGivesLlama3Frequencies) {
  ExpectInvFreq(Parse(Llama31()).value(), kLlama31Llama3, /*max_inexact=*/0);
}

}  // namespace
}  // namespace kvmesh::model
