// engine_step_bench: where one engine decode step's time goes, op by op, at
// batch 1 and at batch 16 on the default model (the target of #3: batch-16
// output tokens/s >= 6x single-request decode).
//
// For each batch size B: B requests of --input-len random tokens are prefilled,
// then --steps decode steps are timed (median step), with the backend wrapped in
// a TimingBackend so each op kind's share of the step is printed; "engine" is
// the rest of Engine::Step (scheduling, runner bookkeeping, sampling, outputs).
// Prints the batch-B / batch-1 decode throughput ratio.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/ops.h"
#include "backend/timing_backend.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "engine/paged_model_runner.h"

namespace kvmesh {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "engine_step_bench: %s\n", std::string(s.message()).c_str());
  std::exit(1);
}

struct StepProfile {
  double median_step_ms = 0;
  double ops_ms[static_cast<int>(backend::OpKind::kCount)] = {};
  double engine_ms = 0;
};

StepProfile Profile(engine::LlamaModel& model, backend::TimingBackend& timing, DType kv_dtype, int batch,
                    int input_len, int steps) {
  auto runner =
      engine::PagedModelRunner::Create(model, {.kv_cache_bytes = int64_t{256} << 20, .kv_cache_dtype = kv_dtype});
  if (!runner.ok()) Die(runner.status());
  engine::EngineOptions options;
  options.max_model_len = static_cast<int32_t>(model.config().max_position_embeddings);
  auto engine = engine::Engine::Create(options, **runner);
  if (!engine.ok()) Die(engine.status());
  std::mt19937_64 rng(7);
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    r.request_id = absl::StrCat("r", i);
    for (int j = 0; j < input_len; ++j) r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 4000));
    r.sampling_params.temperature = 0.0f;
    r.sampling_params.max_tokens = steps + 8;
    r.sampling_params.ignore_eos = true;
    if (auto s = (*engine)->AddRequest(std::move(r)); !s.ok()) Die(s);
  }
  // Prefill (and a couple of warm decode steps).
  for (int i = 0; i < 3; ++i) {
    if (auto out = (*engine)->Step(); !out.ok()) Die(out.status());
  }
  timing.Reset();
  std::vector<double> times;
  double total = 0;
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    auto out = (*engine)->Step();
    if (!out.ok()) Die(out.status());
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  StepProfile p;
  p.median_step_ms = 1e3 * times[times.size() / 2];
  double ops_total = 0;
  for (int k = 0; k < static_cast<int>(backend::OpKind::kCount); ++k) {
    p.ops_ms[k] = 1e-6 * static_cast<double>(timing.Totals()[k].nanoseconds) / steps;
    ops_total += p.ops_ms[k];
  }
  // Scale the mean breakdown to the median step.
  const double mean_ms = 1e3 * total / steps;
  const double scale = p.median_step_ms / mean_ms;
  for (double& ms : p.ops_ms) ms *= scale;
  p.engine_ms = p.median_step_ms - ops_total * scale;
  return p;
}

int Main(int argc, char** argv) {
  // Usage: engine_step_bench [--threads N] [--input-len L] [--steps S] [--kv-cache-dtype auto|f32|bf16] [MODEL_DIR]
  const char* dir = KVMESH_TINY_MODEL_DIR;
  int threads = 0;
  int input_len = 64;
  int steps = 200;
  std::string kv_dtype_name = "auto";  // as `kvmesh serve`: bf16 for a bf16 model
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--input-len" && i + 1 < argc) {
      input_len = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--kv-cache-dtype" && i + 1 < argc) {
      kv_dtype_name = argv[++i];
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else {
      dir = argv[i];
    }
  }
  if (threads > 0) omp_set_num_threads(threads);
  auto cpu = backend::CreateCpuBackend({.num_threads = threads});
  if (!cpu.ok()) Die(cpu.status());
  backend::TimingBackend timing(**cpu);
  auto model = engine::LlamaModel::Load(dir, timing, {});
  if (!model.ok()) Die(model.status());
  const bool bf16_model = (*model)->weights().embed_tokens.dtype == DType::kBF16;
  const DType kv_dtype = kv_dtype_name == "f32"    ? DType::kF32
                         : kv_dtype_name == "bf16" ? DType::kBF16
                                                   : (bf16_model ? DType::kBF16 : DType::kF32);
  std::printf("model %s, backend %s, %d threads, KV %s; prompt %d tokens, median of %d decode steps\n", dir,
              std::string(timing.name()).c_str(), omp_get_max_threads(), kv_dtype == DType::kBF16 ? "bf16" : "f32",
              input_len, steps);
  const int batches[] = {1, 16};
  StepProfile profiles[2];
  for (int b = 0; b < 2; ++b) profiles[b] = Profile(**model, timing, kv_dtype, batches[b], input_len, steps);
  std::printf("\n%-16s", "ms per step");
  for (int b : batches) std::printf("   batch %-3d", b);
  std::printf("\n");
  for (int k = 0; k < static_cast<int>(backend::OpKind::kCount); ++k) {
    if (profiles[0].ops_ms[k] == 0 && profiles[1].ops_ms[k] == 0) continue;
    std::printf("%-16s", std::string(backend::OpKindName(static_cast<backend::OpKind>(k))).c_str());
    for (const StepProfile& p : profiles)
      std::printf("   %6.3f %3.0f%%", p.ops_ms[k], 100 * p.ops_ms[k] / p.median_step_ms);
    std::printf("\n");
  }
  std::printf("%-16s", "engine (rest)");
  for (const StepProfile& p : profiles) std::printf("   %6.3f %3.0f%%", p.engine_ms, 100 * p.engine_ms / p.median_step_ms);
  std::printf("\n%-16s", "step");
  for (const StepProfile& p : profiles) std::printf("   %6.3f     ", p.median_step_ms);
  const double tps1 = 1e3 / profiles[0].median_step_ms;
  const double tps16 = 16e3 / profiles[1].median_step_ms;
  std::printf("\n\ndecode tokens/s: batch 1 %.0f, batch 16 %.0f; ratio %.2fx (target >= 6x)\n", tps1, tps16,
              tps16 / tps1);
  return 0;
}

}  // namespace
}  // namespace kvmesh

int main(int argc, char** argv) { return kvmesh::Main(argc, argv); }
