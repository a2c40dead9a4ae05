// Logits parity of LlamaModel with Hugging Face transformers.
//
// Fixtures: tests/data/reference/<model>.{json,bin}, made by
// tools/make-reference-logits from transformers (float32, eager attention) on
// the same weights the build generates with tools/make-tiny-model.
#include "engine/llama_model.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/file_util.h"

namespace kvmesh::engine {
namespace {

struct ParityCase {
  std::string model;
  std::string backend;  // "cpu" or "reference"
  float tolerance;      // max |Δlogit| allowed
};

void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.model << " on " << c.backend; }

std::string CaseName(const testing::TestParamInfo<ParityCase>& info) {
  std::string name = info.param.model + "_" + info.param.backend;
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

struct Fixture {
  nlohmann::json manifest;
  std::vector<float> logits;
};

Fixture LoadFixture(const std::string& model) {
  const std::string base = std::string(KVMESH_SOURCE_DIR) + "/tests/data/reference/" + model;
  Fixture f;
  auto text = ReadFileToString(base + ".json");
  EXPECT_TRUE(text.ok()) << text.status();
  f.manifest = nlohmann::json::parse(*text);
  auto bin = ReadFileToString(base + ".bin");
  EXPECT_TRUE(bin.ok()) << bin.status();
  f.logits.resize(bin->size() / sizeof(float));
  std::memcpy(f.logits.data(), bin->data(), f.logits.size() * sizeof(float));
  return f;
}

std::unique_ptr<backend::Backend> MakeBackend(const std::string& name) {
  if (name == "reference") return backend::CreateReferenceBackend();
  auto cpu = backend::CreateCpuBackend({});
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  return std::move(cpu).value();
}

class LlamaModelParityTest : public testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    model_dir_ = std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam().model;
    fixture_ = LoadFixture(GetParam().model);
    // The fixture is only meaningful for the exact weights it was computed on.
    auto provenance = ReadFileToString(model_dir_ + "/kvmesh-tiny-model.json");
    ASSERT_TRUE(provenance.ok()) << provenance.status();
    ASSERT_EQ(nlohmann::json::parse(*provenance)["model_safetensors_sha256"],
              fixture_.manifest["model_safetensors_sha256"])
        << model_dir_ << " differs from the weights the fixture was made on; rerun tools/make-reference-logits";
    backend_ = MakeBackend(GetParam().backend);
    auto model = LlamaModel::Load(model_dir_, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
  }

  // Max |Δ| between our logits at the case's kept positions and the fixture's.
  float MaxLogitError(const nlohmann::json& c, const std::vector<float>& ours) {
    const int64_t vocab = fixture_.manifest["vocab_size"];
    const int64_t offset = c["logits_offset_floats"];
    float max_err = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      const float ref = fixture_.logits[offset + i];
      max_err = std::max(max_err, std::fabs(ours[i] - ref));
      if (std::isnan(ours[i])) return INFINITY;
    }
    EXPECT_EQ(static_cast<int64_t>(ours.size()), static_cast<int64_t>(c["positions"].size()) * vocab);
    return max_err;
  }

  std::string model_dir_;
  Fixture fixture_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(LlamaModelParityTest, PromptLogitsMatchTransformers) {
  for (const auto& c : fixture_.manifest["cases"]) {
    const std::vector<int32_t> ids = c["prompt_ids"];
    const std::vector<int32_t> rows = c["positions"];
    auto cache = model_->NewKvCache(static_cast<int64_t>(ids.size()));
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    ASSERT_TRUE(model_->Forward(ids, *cache, rows, &logits).ok());
    const float err = MaxLogitError(c, logits);
    EXPECT_LE(err, GetParam().tolerance) << c["name"] << " (" << ids.size() << " tokens)";
    std::printf("%s on %s, %s (%zu tokens): max |dlogit| = %.3g\n", GetParam().model.c_str(),
                GetParam().backend.c_str(), std::string(c["name"]).c_str(), ids.size(), err);
  }
}

TEST_P(LlamaModelParityTest, ChunkedPrefillGivesTheSameLogits) {
  const auto& c = fixture_.manifest["cases"][0];
  const std::vector<int32_t> ids = c["prompt_ids"];
  const std::vector<int32_t> rows = c["positions"];
  for (int chunk : {1, 5}) {
    auto cache = model_->NewKvCache(static_cast<int64_t>(ids.size()));
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    size_t next_row = 0;
    for (size_t begin = 0; begin < ids.size(); begin += chunk) {
      const size_t end = std::min(ids.size(), begin + chunk);
      std::vector<int32_t> local_rows;
      while (next_row < rows.size() && static_cast<size_t>(rows[next_row]) < end) {
        local_rows.push_back(rows[next_row++] - static_cast<int32_t>(begin));
      }
      ASSERT_TRUE(model_->Forward(std::span(ids).subspan(begin, end - begin), *cache, local_rows, &logits).ok());
    }
    EXPECT_LE(MaxLogitError(c, logits), GetParam().tolerance) << "chunk " << chunk;
  }
}

TEST_P(LlamaModelParityTest, GreedyContinuationMatchesTransformers) {
  for (const auto& c : fixture_.manifest["cases"]) {
    const std::vector<int32_t> ids = c["prompt_ids"];
    const std::vector<int32_t> expected = c["greedy_ids"];
    if (GetParam().backend == "reference" && ids.size() > 512) continue;  // the oracle is slow
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
    EXPECT_EQ(generated, expected) << c["name"];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, LlamaModelParityTest,
    testing::Values(ParityCase{"tiny-llama", "cpu", 1e-2f},        // bf16 weights, the default model
                    ParityCase{"llama-f32", "cpu", 1e-3f},         // f32 weights, GQA 4:2
                    ParityCase{"llama-f32", "reference", 1e-3f},   // the scalar oracle agrees too
                    ParityCase{"llama-f16", "cpu", 1e-3f},         // f16 weights
                    ParityCase{"qwen2-f32", "cpu", 1e-3f},         // Qwen2: q/k/v bias
                    ParityCase{"tied-f32", "cpu", 1e-3f},          // tied embeddings, MHA
                    ParityCase{"llama3-rope-f32", "cpu", 1e-3f}),  // llama3 RoPE scaling, 2,100 tokens, MQA
    CaseName);

class LlamaModelInputTest : public testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeBackend("cpu");
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/llama-f32", *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
  }
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(LlamaModelInputTest, RejectsTokenOutsideVocabulary) {
  auto cache = model_->NewKvCache(8);
  ASSERT_TRUE(cache.ok());
  const int32_t ids[] = {1, static_cast<int32_t>(model_->config().vocab_size)};
  std::vector<float> logits;
  EXPECT_EQ(model_->Forward(ids, *cache, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->num_tokens(), 0);
}

TEST_F(LlamaModelInputTest, RejectsChunkThatOverflowsTheCache) {
  auto cache = model_->NewKvCache(2);
  ASSERT_TRUE(cache.ok());
  const int32_t ids[] = {1, 2, 3};
  std::vector<float> logits;
  EXPECT_EQ(model_->Forward(ids, *cache, {}, &logits).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(model_->Forward({}, *cache, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LlamaModelInputTest, MissingModelDirectoryNamesThePath) {
  auto model = LlamaModel::Load("/nonexistent/model", *backend_);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(std::string(model.status().message()).find("/nonexistent/model"), std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace kvmesh::engine
