// `kvmesh bench throughput`: offline throughput of the continuous-batching engine
// on a synthetic workload — requests/s, output tokens/s, time to first token, and
// what the KV cache did (prefilled tokens, prefix-cache hits, preemptions).
//
// Workload: --num-prompts requests of --input-len random tokens (seeded), each
// generating exactly --output-len tokens (ignore_eos); with --shared-prefix-len P
// every prompt starts with the same P tokens. At most --concurrency requests are
// in flight; a new one is added as soon as one finishes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"
#include "core/flag_checks.h"

ABSL_FLAG(int, num_prompts, 64, "Requests in the workload.");
KVMESH_FLAG_RANGE(num_prompts, 1, 10000000);
ABSL_FLAG(int, input_len, 128, "Prompt tokens per request (including the shared prefix).");
KVMESH_FLAG_RANGE(input_len, 1, 1 << 24);
ABSL_FLAG(int, output_len, 128, "Generated tokens per request.");
KVMESH_FLAG_RANGE(output_len, 1, 1 << 24);
ABSL_FLAG(int, shared_prefix_len, 0, "Leading prompt tokens every request shares (prefix-cache workload).");
KVMESH_FLAG_RANGE(shared_prefix_len, 0, 1 << 24);
ABSL_FLAG(int, concurrency, 16, "Requests in flight at once.");
KVMESH_FLAG_RANGE(concurrency, 1, 1000000);
ABSL_FLAG(int, workload_seed, 1, "Seed of the random prompts.");
KVMESH_FLAG_RANGE(workload_seed, INT32_MIN, INT32_MAX);

namespace kvmesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh bench throughput: %s\n", message.c_str());
  return 1;
}

}  // namespace

int RunBenchThroughput(int argc, char** argv) {
  ParseSubcommandFlags(argc, argv,
                       "kvmesh bench throughput [--num-prompts N --input-len L --output-len L "
                       "--shared-prefix-len P --concurrency C]: offline engine throughput",
                       {"bench_throughput_command", kEngineFlagsFile});
  auto loaded = LoadModelFromFlags(/*quiet=*/false);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  engine::LlamaModel& model = *loaded->model;
  const int num_prompts = absl::GetFlag(FLAGS_num_prompts);
  const int input_len = absl::GetFlag(FLAGS_input_len);
  const int output_len = absl::GetFlag(FLAGS_output_len);
  const int shared = absl::GetFlag(FLAGS_shared_prefix_len);
  const int concurrency = std::max(1, absl::GetFlag(FLAGS_concurrency));
  if (num_prompts < 1 || input_len < 1 || output_len < 1 || shared < 0 || shared > input_len)
    return Fail("need num_prompts, input_len, output_len >= 1 and 0 <= shared_prefix_len <= input_len");

  auto built = BuildEngineFromFlags(model);
  if (!built.ok()) return Fail(std::string(built.status().message()));
  std::unique_ptr<engine::ModelRunner>& runner = built->runner;
  const engine::EngineOptions& options = built->options;
  auto engine = engine::Engine::Create(options, *runner);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));

  // The workload: random tokens from the tokenizer's range, a common prefix if asked.
  std::mt19937_64 rng(absl::GetFlag(FLAGS_workload_seed));
  const int32_t vocab = loaded->tokenizer->vocab_size();
  auto random_token = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)); };
  std::vector<int32_t> prefix(shared);
  for (int32_t& t : prefix) t = random_token();
  std::vector<std::vector<int32_t>> prompts(num_prompts, prefix);
  for (auto& p : prompts) {
    while (static_cast<int>(p.size()) < input_len) p.push_back(random_token());
  }

  std::vector<Clock::time_point> added(num_prompts);
  std::vector<bool> streamed(num_prompts, false);  // its first token came
  std::vector<double> ttft, e2e;
  int next = 0, finished = 0;
  int64_t output_tokens = 0;
  auto add_next = [&]() -> absl::Status {
    engine::EngineRequest request;
    request.request_id = absl::StrCat("bench-", next);
    request.prompt_token_ids = prompts[next];
    request.sampling_params.temperature = 0.0f;
    request.sampling_params.max_tokens = output_len;
    request.sampling_params.ignore_eos = true;
    added[next] = Clock::now();
    ++next;
    return (*engine)->AddRequest(std::move(request));
  };
  const auto start = Clock::now();
  while (finished < num_prompts) {
    while (next < num_prompts && next - finished < concurrency) {
      if (auto s = add_next(); !s.ok()) return Fail(std::string(s.message()));
    }
    auto outputs = (*engine)->Step();
    if (!outputs.ok()) return Fail(std::string(outputs.status().message()));
    const auto now = Clock::now();
    for (const engine::RequestOutput& out : *outputs) {
      const int index = std::stoi(out.request_id.substr(6));
      for (const auto& completion : out.outputs) {
        if (!completion.new_token_ids.empty() && !streamed[index]) {
          streamed[index] = true;
          ttft.push_back(std::chrono::duration<double>(now - added[index]).count());
        }
        output_tokens += static_cast<int64_t>(completion.new_token_ids.size());
      }
      if (out.finished) {
        if (!out.status.ok()) return Fail(std::string(out.status.message()));
        e2e.push_back(std::chrono::duration<double>(now - added[index]).count());
        ++finished;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const engine::EngineStats stats = (*engine)->stats();
  const int64_t prompt_tokens = static_cast<int64_t>(num_prompts) * input_len;

  std::printf("workload         %d requests x (%d prompt + %d output tokens), shared prefix %d, concurrency %d\n",
              num_prompts, input_len, output_len, shared, concurrency);
  std::printf("engine           max_num_seqs %d, max_num_batched_tokens %d, KV %d blocks x %d tokens, %s\n",
              options.scheduler.max_num_seqs, options.scheduler.max_num_batched_tokens, runner->num_blocks(),
              runner->block_size_tokens(), std::string(loaded->backend->name()).c_str());
  std::printf("throughput       %.2f requests/s, %.1f output tokens/s, %.1f total tokens/s (%.2f s)\n",
              num_prompts / seconds, output_tokens / seconds, (prompt_tokens + output_tokens) / seconds, seconds);
  std::printf("TTFT             p50 %.1f ms, p90 %.1f ms\n", 1e3 * Percentile(ttft, 50), 1e3 * Percentile(ttft, 90));
  std::printf("end-to-end       p50 %.1f ms, p90 %.1f ms\n", 1e3 * Percentile(e2e, 50), 1e3 * Percentile(e2e, 90));
  std::printf("prefill work     %lld of %lld prompt tokens computed (%.1f%% saved by the prefix cache)\n",
              static_cast<long long>(stats.num_prefill_tokens), static_cast<long long>(prompt_tokens),
              100.0 * (1.0 - static_cast<double>(stats.num_prefill_tokens) / prompt_tokens));
  std::printf("prefix cache     %lld queries, %lld hits, %lld of %lld queried tokens hit\n",
              static_cast<long long>(stats.prefix_cache_queries), static_cast<long long>(stats.prefix_cache_hits),
              static_cast<long long>(stats.prefix_cache_hit_tokens),
              static_cast<long long>(stats.prefix_cache_query_tokens));
  std::printf("KV cache         %d blocks: %d used, %d cached, %d free at the end; %lld preemptions; %lld deferred admissions; %lld steps\n",
              stats.num_kv_blocks, stats.num_kv_blocks_used, stats.num_kv_blocks_cached, stats.num_kv_blocks_free,
              static_cast<long long>(stats.num_preemptions), static_cast<long long>(stats.num_deferred_for_prefix),
              static_cast<long long>(stats.num_steps));
  return 0;
}

}  // namespace kvmesh::cli
