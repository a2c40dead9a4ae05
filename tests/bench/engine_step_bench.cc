// engine_step_bench: where one engine decode step's time goes, op by op, at
// batch 1 and at batch 16 on the default model (the target of #3: batch-16
// output tokens/s >= 6x single-request decode).
//
// For each batch size B: B requests of --input-len random tokens are prefilled,
// then --steps decode steps are timed (median step), with the backend wrapped in
// a TimingBackend so each op kind's share of the step is printed; "engine" is
// the rest of Engine::Step (scheduling, runner bookkeeping, sampling, outputs).
// Prints the batch-B / batch-1 decode throughput ratio.
//
// What makes the figures trustworthy (#16):
//  1. The KV pool is sized for every request's whole context (prompt + steps), so
//     all B requests run together: a fixed 256 MiB pool used to hold only ~5 of 16
//     2k-token SmolLM2 contexts, and the bench then timed a batch of ~5 (plus the
//     prefill chunks of the waiting ones) while calling it 16.
//  2. Prefill runs until every request has its first token; each timed step must
//     then produce exactly one token for each of the B requests, or the bench fails.
//  3. Beside the times it prints the bytes each streaming op read per step (Linear:
//     weights, PagedAttention: K and V of every attended position) and the achieved
//     bandwidth, against the STREAM copy bandwidth backend_bench measures (the same
//     MeasureCopyBandwidthBytesPerSecond, run here in the same process) and against
//     the read bandwidth (MeasureReadBandwidthBytesPerSecond): weights and KV are
//     only read, and a copy counts its reads and its writes.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backend/cpu/memory_bandwidth.h"
#include "backend/ops.h"
#include "backend/timing_backend.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "engine/paged_model_runner.h"
#include "kv/kv_layout.h"

namespace kvmesh {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "engine_step_bench: %s\n", std::string(s.message()).c_str());
  std::exit(1);
}

struct StepProfile {
  int batch = 0;
  double median_step_ms = 0;
  double ops_ms[static_cast<int>(backend::OpKind::kCount)] = {};
  double ops_bytes[static_cast<int>(backend::OpKind::kCount)] = {};  // per step
  double engine_ms = 0;
};

StepProfile Profile(engine::LlamaModel& model, backend::TimingBackend& timing, DType kv_dtype, int batch,
                    int input_len, int steps) {
  // Requests admitted first decode while the others still prefill (chunked prefill
  // runs max_num_batched_tokens per step), so each may generate up to that many steps
  // more than the timed ones before the last starts: max_tokens covers them, so that
  // no request finishes inside the timed steps.
  engine::EngineOptions options;
  options.max_model_len = static_cast<int32_t>(model.config().max_position_embeddings);
  options.scheduler.max_num_seqs = std::max(options.scheduler.max_num_seqs, batch);
  const int64_t prefill_steps =
      (int64_t{batch} * input_len + options.scheduler.max_num_batched_tokens - 1) / options.scheduler.max_num_batched_tokens;
  const int32_t max_tokens = static_cast<int32_t>(steps + 8 + 2 * prefill_steps + batch);
  // Whole contexts of every request, with a block of slack each (1).
  const int32_t block = kv::kDefaultBlockSizeTokens;
  const int32_t blocks_per_request = (input_len + max_tokens + block - 1) / block + 1;
  auto runner = engine::PagedModelRunner::Create(
      model, {.num_blocks = batch * blocks_per_request + 16, .kv_cache_dtype = kv_dtype});
  if (!runner.ok()) Die(runner.status());
  auto engine = engine::Engine::Create(options, **runner);
  if (!engine.ok()) Die(engine.status());
  std::mt19937_64 rng(7);
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    r.request_id = absl::StrCat("r", i);
    for (int j = 0; j < input_len; ++j) r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 4000));
    r.sampling_params.temperature = 0.0f;
    r.sampling_params.max_tokens = max_tokens;
    r.sampling_params.ignore_eos = true;
    if (auto s = (*engine)->AddRequest(std::move(r)); !s.ok()) Die(s);
  }
  // Prefill until every request has its first token (2), then two warm decode steps.
  auto tokens_of = [](const std::vector<engine::RequestOutput>& outs) {
    int64_t n = 0;
    for (const auto& o : outs) {
      for (const auto& c : o.outputs) n += static_cast<int64_t>(c.new_token_ids.size());
    }
    return n;
  };
  absl::flat_hash_set<std::string> started;
  for (int guard = 0; static_cast<int>(started.size()) < batch; ++guard) {
    auto out = (*engine)->Step();
    if (!out.ok()) Die(out.status());
    for (const auto& o : *out) {
      if (tokens_of({o}) > 0) started.insert(o.request_id);
    }
    if (guard > 100000) Die(absl::InternalError("prefill did not finish"));
  }
  for (int i = 0; i < 2; ++i) {
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
    if (const int64_t n = tokens_of(*out); n != batch)
      Die(absl::InternalError(absl::StrCat("timed step ", i, " decoded ", n, " tokens, not the batch of ", batch)));
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  StepProfile p;
  p.batch = batch;
  p.median_step_ms = 1e3 * times[times.size() / 2];
  double ops_total = 0;
  for (int k = 0; k < static_cast<int>(backend::OpKind::kCount); ++k) {
    p.ops_ms[k] = 1e-6 * static_cast<double>(timing.Totals()[k].nanoseconds) / steps;
    p.ops_bytes[k] = static_cast<double>(timing.Totals()[k].bytes) / steps;
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
  // Usage: engine_step_bench [--threads N] [--input-len L] [--steps S] [--batches 1,16]
  //                          [--kv-cache-dtype auto|f32|bf16] [--compute-dtype f32|bf16]
  //                          [--no-copy-bandwidth] [MODEL_DIR]
  const char* dir = KVMESH_TINY_MODEL_DIR;
  int threads = 0;
  int input_len = 64;
  int steps = 200;
  std::string kv_dtype_name = "auto";  // as `kvmesh serve`: bf16 for a bf16 model
  std::vector<int> batches = {1, 16};
  bool measure_copy = true;
  DType compute_dtype = DType::kF32;  // CpuBackendOptions::compute_dtype
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--input-len" && i + 1 < argc) {
      input_len = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--kv-cache-dtype" && i + 1 < argc) {
      kv_dtype_name = argv[++i];
    } else if (arg == "--batches" && i + 1 < argc) {
      batches.clear();
      for (absl::string_view b : absl::StrSplit(argv[++i], ',')) batches.push_back(std::max(1, std::atoi(std::string(b).c_str())));
    } else if (arg == "--compute-dtype" && i + 1 < argc) {
      compute_dtype = std::string(argv[++i]) == "bf16" ? DType::kBF16 : DType::kF32;
    } else if (arg == "--no-copy-bandwidth") {
      measure_copy = false;
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else {
      dir = argv[i];
    }
  }
  if (threads > 0) omp_set_num_threads(threads);
  auto cpu = backend::CreateCpuBackend({.num_threads = threads, .compute_dtype = compute_dtype});
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
  // The roofline, measured in this process before the profiles (as backend_bench does).
  const double copy_bw = measure_copy ? backend::MeasureCopyBandwidthBytesPerSecond(threads) : 0;
  const double read_bw = measure_copy ? backend::MeasureReadBandwidthBytesPerSecond(threads) : 0;
  if (measure_copy) {
    std::printf("copy bandwidth (STREAM copy, read+write, as backend_bench): %.2f GB/s; read bandwidth (a sum): %.2f GB/s\n",
                copy_bw / 1e9, read_bw / 1e9);
  }
  std::vector<StepProfile> profiles;
  for (int b : batches) profiles.push_back(Profile(**model, timing, kv_dtype, b, input_len, steps));
  std::printf("\n%-16s", "ms per step");
  for (const StepProfile& p : profiles) std::printf("   batch %-4d    ", p.batch);
  std::printf("\n");
  for (int k = 0; k < static_cast<int>(backend::OpKind::kCount); ++k) {
    bool any = false;
    for (const StepProfile& p : profiles) any = any || p.ops_ms[k] != 0;
    if (!any) continue;
    std::printf("%-16s", std::string(backend::OpKindName(static_cast<backend::OpKind>(k))).c_str());
    for (const StepProfile& p : profiles) std::printf("   %7.3f %3.0f%%    ", p.ops_ms[k], 100 * p.ops_ms[k] / p.median_step_ms);
    std::printf("\n");
  }
  std::printf("%-16s", "engine (rest)");
  for (const StepProfile& p : profiles)
    std::printf("   %7.3f %3.0f%%    ", p.engine_ms, 100 * p.engine_ms / p.median_step_ms);
  std::printf("\n%-16s", "step");
  for (const StepProfile& p : profiles) std::printf("   %7.3f         ", p.median_step_ms);
  std::printf("\n\nbytes streamed per step, achieved bandwidth (bytes / op time) and its fraction of copy and of read "
              "bandwidth\n");
  for (const backend::OpKind kind : {backend::OpKind::kPagedAttention, backend::OpKind::kLinear}) {
    const int k = static_cast<int>(kind);
    for (const StepProfile& p : profiles) {
      const double gbs = p.ops_ms[k] > 0 ? p.ops_bytes[k] / (p.ops_ms[k] * 1e-3) / 1e9 : 0;
      std::printf("  %-15s batch %-4d %9.1f MB  %8.3f ms  %7.2f GB/s", std::string(backend::OpKindName(kind)).c_str(),
                  p.batch, p.ops_bytes[k] / 1e6, p.ops_ms[k], gbs);
      if (copy_bw > 0) std::printf("  %5.1f%% of copy  %5.1f%% of read", 100 * gbs * 1e9 / copy_bw, 100 * gbs * 1e9 / read_bw);
      std::printf("\n");
    }
  }
  if (profiles.size() >= 2) {
    const StepProfile& a = profiles.front();
    const StepProfile& b = profiles.back();
    const double tps_a = a.batch * 1e3 / a.median_step_ms;
    const double tps_b = b.batch * 1e3 / b.median_step_ms;
    std::printf("\ndecode tokens/s: batch %d %.0f, batch %d %.0f; ratio %.2fx (target >= 6x at 16 vs 1)\n",
                a.batch, tps_a, b.batch, tps_b, tps_b / tps_a);
  }
  return 0;
}

}  // namespace
}  // namespace kvmesh

int main(int argc, char** argv) { return kvmesh::Main(argc, argv); }
