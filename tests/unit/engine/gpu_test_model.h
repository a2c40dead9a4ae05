// The tiny test model on GPU 0, for the engine's GPU tests (cuda_engine_tiers_test,
// cuda_disaggregation_test), which skip where there is no GPU.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "engine/cuda_model_runner.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "generation_checks.h"

namespace kvmesh::engine::testing_util {

// A test model's directory: under $KVMESH_TEST_MODELS_DIR (tools/gpu-check's pack), else
// the build's models/.
inline std::string TestModelDir(const std::string& name) {
  const char* dir = std::getenv("KVMESH_TEST_MODELS_DIR");
  return (dir != nullptr && *dir != 0 ? std::string(dir) : std::string(KVMESH_BINARY_DIR) + "/models") + "/" + name;
}

struct GpuTestModel {
  std::unique_ptr<backend::Backend> backend;  // declared first: the model borrows it
  std::unique_ptr<LlamaModel> model;
};

// Loads tiny-llama on GPU 0 into *out. Call from SetUp: skips the test where no GPU is,
// fails it where one is and the model does not load.
inline void LoadTinyModelOnGpuOrSkip(GpuTestModel* out) {
  auto gpu = backend::CreateCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << "no GPU here (" << gpu.status().message() << "); this test runs where one is";
  out->backend = std::move(gpu).value();
  auto model = LlamaModel::Load(TestModelDir("tiny-llama"), *out->backend);
  ASSERT_TRUE(model.ok()) << model.status();
  out->model = std::move(model).value();
}

// An engine over its own CUDA runner: small steps (MakeSmallStepEngine), 256 tokens and 4
// sequences a step, contexts up to 512; `runner` sets the block size, the pool and the rest.
struct GpuEngine {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Engine> engine;  // null when the runner could not be made (the test failed)
};
inline GpuEngine MakeGpuEngine(LlamaModel& model, CudaModelRunnerOptions runner, EngineKvTierOptions tiers = {}) {
  runner.max_num_tokens = 256;
  runner.max_num_seqs = 4;
  runner.max_model_len = 512;
  GpuEngine w;
  auto created = CreateCudaModelRunner(model, runner);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return w;
  w.runner = std::move(created).value();
  w.engine = MakeSmallStepEngine(*w.runner, std::move(tiers), runner.block_size_tokens);
  return w;
}

}  // namespace kvmesh::engine::testing_util
