// `kvmesh bench`: prefill and single-request decode speed on one model, and
// decode against its memory-bandwidth roofline.
//
// Decode of one sequence is bound by memory bandwidth: every step reads every
// weight once (plus the KV cache so far). The roofline is
//   tokens/s <= copy bandwidth / bytes read per token,
// with the copy bandwidth measured on this machine (STREAM-style copy, bytes
// read + written). Figures are medians over --repeats runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "backend/cpu/memory_bandwidth.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "core/flag_checks.h"

ABSL_FLAG(int, prompt_tokens, 512, "Prompt length for the prefill measurement.");
KVMESH_FLAG_RANGE(prompt_tokens, 1, 1 << 24);
ABSL_FLAG(int, decode_tokens, 128, "Tokens decoded (greedy) after a --decode_context-token prompt.");
KVMESH_FLAG_RANGE(decode_tokens, 1, 1 << 24);
ABSL_FLAG(int, decode_context, 128, "Prompt length before the decode measurement.");
KVMESH_FLAG_RANGE(decode_context, 1, 1 << 24);
ABSL_FLAG(int, repeats, 5, "Runs of each measurement; medians are reported.");
KVMESH_FLAG_RANGE(repeats, 1, 100000);

namespace kvmesh::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::vector<int32_t> RandomTokens(int n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

}  // namespace

int RunBench(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "throughput") return RunBenchThroughput(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "multi-turn") return RunBenchMultiTurn(argc - 1, argv + 1);
  ParseSubcommandFlags(argc, argv,
                       "kvmesh bench [--model DIR] [--prompt-tokens N] [--decode-tokens N] [--repeats N]: "
                       "prefill and decode tokens/s, and decode against the memory-bandwidth roofline.\n"
                       "kvmesh bench throughput --help: the continuous-batching engine's offline throughput",
                       {"bench_command"});
  auto loaded = LoadModelFromFlags(/*quiet=*/false);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvmesh bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  engine::LlamaModel& model = *loaded->model;
  const auto& config = model.config();
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  const int decode_context = absl::GetFlag(FLAGS_decode_context);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  if (prompt_tokens < 1 || decode_tokens < 1 || decode_context < 1) {
    std::fprintf(stderr, "kvmesh bench: token counts must be positive\n");
    return 2;
  }
  const int32_t vocab = loaded->tokenizer->vocab_size();

  // Prefill: one chunk of prompt_tokens, logits for the last row only.
  std::vector<double> prefill_seconds;
  for (int r = 0; r < repeats + 1; ++r) {
    auto cache = model.NewKvCache(prompt_tokens);
    if (!cache.ok()) return 1;
    const std::vector<int32_t> ids = RandomTokens(prompt_tokens, vocab, 100 + r);
    const int32_t last = prompt_tokens - 1;
    std::vector<float> logits;
    const auto start = std::chrono::steady_clock::now();
    if (auto s = model.Forward(ids, *cache, {&last, 1}, &logits); !s.ok()) {
      std::fprintf(stderr, "kvmesh bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    if (r > 0) prefill_seconds.push_back(Seconds(start));  // run 0 warms caches and scratch
  }

  // Decode: per-token step time after a decode_context-token prompt, greedy.
  std::vector<double> step_seconds;
  for (int r = 0; r < repeats; ++r) {
    auto cache = model.NewKvCache(decode_context + decode_tokens);
    if (!cache.ok()) return 1;
    const std::vector<int32_t> ids = RandomTokens(decode_context, vocab, 200 + r);
    const int32_t last = decode_context - 1, row0 = 0;
    std::vector<float> logits;
    if (!model.Forward(ids, *cache, {&last, 1}, &logits).ok()) return 1;
    for (int i = 0; i < decode_tokens; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      logits.clear();
      const auto start = std::chrono::steady_clock::now();
      if (!model.Forward({&next, 1}, *cache, {&row0, 1}, &logits).ok()) return 1;
      step_seconds.push_back(Seconds(start));
    }
  }

  // Decode only reads its weights and KV: the read bandwidth is its roofline.
  const double copy_bandwidth = backend::MeasureCopyBandwidthBytesPerSecond(0);
  const double bandwidth = backend::MeasureReadBandwidthBytesPerSecond(0);
  const double prefill_tps = prompt_tokens / Median(prefill_seconds);
  const double step = Median(step_seconds);
  const double decode_tps = 1.0 / step;
  // KV read per step at the mean context of the decode run (f32 K and V).
  const double mean_context = decode_context + decode_tokens / 2.0;
  const double kv_bytes = mean_context * config.num_hidden_layers * 2.0 * config.num_key_value_heads *
                          config.head_dim * sizeof(float);
  const double bytes_per_token = static_cast<double>(model.weight_bytes_per_token()) + kv_bytes;
  const double roofline_tps = bandwidth / bytes_per_token;
  // Linear-layer FLOPs per prompt token (the LM head runs for the last row only).
  const double flops_per_token =
      2.0 * static_cast<double>(model.weight_bytes_per_token() - model.lm_head_bytes()) / DTypeSize(config.torch_dtype);

  std::printf("model            %s (%s weights)\n", model.model_dir().c_str(),
              std::string(DTypeName(config.torch_dtype)).c_str());
  std::printf("backend          %s\n", std::string(loaded->backend->name()).c_str());
  std::printf("prefill          %8.1f tokens/s  (%d-token prompt, median of %d; ~%.1f GFLOP/s in the linear layers)\n", prefill_tps,
              prompt_tokens, repeats, prefill_tps * flops_per_token / 1e9);
  std::printf("decode           %8.1f tokens/s  (%.2f ms/token, median of %zu steps at context %d..%d)\n",
              decode_tps, step * 1e3, step_seconds.size(), decode_context, decode_context + decode_tokens);
  std::printf("bytes/token      %8.1f MB  (weights %.1f MB + KV %.2f MB)\n", bytes_per_token / 1e6,
              model.weight_bytes_per_token() / 1e6, kv_bytes / 1e6);
  std::printf("copy bandwidth   %8.2f GB/s (measured, read+write)\n", copy_bandwidth / 1e9);
  std::printf("read bandwidth   %8.2f GB/s (measured, a sum)\n", bandwidth / 1e9);
  std::printf("decode roofline  %8.1f tokens/s (bytes/token at the read bandwidth)\n", roofline_tps);
  std::printf("decode/roofline  %8.1f %%\n", 100.0 * decode_tps / roofline_tps);
  return 0;
}

}  // namespace kvmesh::cli
