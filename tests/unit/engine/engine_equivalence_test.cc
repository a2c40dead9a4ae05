// The continuous-batching engine on the real model (PagedModelRunner) against the
// dense single-request path (GenerateSingleSequence over LlamaModel::Forward, which
// llama_model_test checks against transformers). For random batches of requests —
// varied prompt lengths, shared prefixes (prefix-cache hits), arrivals mid-run,
// aborts, several chunked-prefill budgets, and a KV pool small enough to force
// preemption and recompute — every finished request must produce exactly the dense
// path's greedy tokens, with per-token logprobs (log-softmax of the logits) within
// 1e-3 (f32 weights).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/dense_kv_cache.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"
#include "engine/single_sequence_generator.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kTopLogprobs = 5;

struct DenseResult {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
};

struct Scenario {
  std::string name;
  int32_t max_num_batched_tokens;
  int32_t num_blocks;  // small pools force preemption
  bool expect_preemption;
};

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class EngineEquivalenceTest : public testing::TestWithParam<Scenario> {
 protected:
  static void SetUpTestSuite() {
    auto backend = backend::CreateCpuBackend({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value().release();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/llama-f32", *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }

  SamplingParams Greedy(int32_t max_tokens) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.logprobs = kTopLogprobs;
    return p;
  }

  DenseResult Dense(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    DenseResult r;
    auto result = GenerateSingleSequence(*model_, prompt, Greedy(max_tokens), {}, [&](const GeneratedToken& t) {
      r.tokens.push_back(t.sample.token_id);
      r.samples.push_back(t.sample);
      return true;
    });
    EXPECT_TRUE(result.ok()) << result.status();
    return r;
  }

  static backend::Backend* backend_;
  static LlamaModel* model_;
};

backend::Backend* EngineEquivalenceTest::backend_ = nullptr;
LlamaModel* EngineEquivalenceTest::model_ = nullptr;

TEST_P(EngineEquivalenceTest, RandomBatchesMatchTheDensePath) {
  const Scenario& scenario = GetParam();
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int32_t> token(0, 3999);
  // Two shared prefixes (40 and 70 tokens) so that later requests hit the prefix cache.
  std::vector<std::vector<int32_t>> prefixes(2);
  for (int32_t len : {40, 70}) {
    for (int32_t i = 0; i < len; ++i) prefixes[len == 40 ? 0 : 1].push_back(token(rng));
  }
  struct Planned {
    std::vector<int32_t> prompt;
    int32_t max_tokens;
    int32_t arrival_step;
    int32_t abort_step;  // -1: never
  };
  std::vector<Planned> plan;
  for (int i = 0; i < 14; ++i) {
    Planned p;
    const int kind = i % 3;
    if (kind > 0) p.prompt = prefixes[kind - 1];
    const int32_t own = std::uniform_int_distribution<int32_t>(1, 60)(rng);
    for (int32_t k = 0; k < own; ++k) p.prompt.push_back(token(rng));
    p.max_tokens = std::uniform_int_distribution<int32_t>(4, 24)(rng);
    p.arrival_step = std::uniform_int_distribution<int32_t>(0, 12)(rng);
    p.abort_step = (i % 5 == 4) ? p.arrival_step + 3 : -1;
    plan.push_back(std::move(p));
  }

  auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = 16, .num_blocks = scenario.num_blocks});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = scenario.max_num_batched_tokens;
  options.scheduler.max_num_seqs = 8;
  options.kv.block_size_tokens = 16;
  options.kv.record_events = false;
  options.max_model_len = 512;
  auto engine = Engine::Create(options, **runner);
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::vector<std::vector<int32_t>> got_tokens(plan.size());
  std::vector<std::vector<SampleResult>> got_samples(plan.size());
  std::vector<bool> finished(plan.size(), false), aborted(plan.size(), false);
  int step = 0;
  auto record = [&](const RequestOutput& out) {
    const size_t i = std::stoul(out.request_id);
    for (const CompletionOutput& c : out.outputs) {
      got_tokens[i].insert(got_tokens[i].end(), c.new_token_ids.begin(), c.new_token_ids.end());
      got_samples[i].insert(got_samples[i].end(), c.new_logprobs.begin(), c.new_logprobs.end());
    }
    if (out.finished) {
      EXPECT_FALSE(finished[i]) << "request " << i << " finished twice";
      finished[i] = true;
    }
  };
  size_t added = 0;
  while (step < 10000) {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].arrival_step == step) {
        EngineRequest r;
        r.request_id = std::to_string(i);
        r.prompt_token_ids = plan[i].prompt;
        r.sampling_params = Greedy(plan[i].max_tokens);
        ASSERT_TRUE((*engine)->AddRequest(std::move(r)).ok());
        ++added;
      }
      if (plan[i].abort_step == step && !finished[i]) {
        auto out = (*engine)->Abort(std::to_string(i));
        ASSERT_TRUE(out.ok()) << out.status();
        record(*out);
        aborted[i] = true;
      }
    }
    if (added == plan.size() && !(*engine)->HasUnfinishedRequests()) break;
    auto outputs = (*engine)->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    for (const RequestOutput& out : *outputs) record(out);
    ++step;
  }
  const EngineStats stats = (*engine)->stats();
  float worst = 0;
  int compared = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    ASSERT_TRUE(finished[i]) << "request " << i << " never finished";
    if (aborted[i]) continue;
    const DenseResult dense = Dense(plan[i].prompt, plan[i].max_tokens);
    ASSERT_EQ(got_tokens[i], dense.tokens) << "request " << i;
    ASSERT_EQ(got_samples[i].size(), dense.samples.size());
    for (size_t t = 0; t < dense.samples.size(); ++t) {
      const float d = std::fabs(*got_samples[i][t].logprob - *dense.samples[t].logprob);
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-3f) << "request " << i << " token " << t;
      for (size_t k = 0; k < dense.samples[t].top_logprobs.size(); ++k) {
        worst = std::max(worst, std::fabs(got_samples[i][t].top_logprobs[k].logprob -
                                          dense.samples[t].top_logprobs[k].logprob));
      }
    }
    ++compared;
  }
  EXPECT_LE(worst, 1e-3f);
  // Every block is back: nothing used once all requests have ended.
  EXPECT_EQ(stats.num_kv_blocks_used, 0);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0) << "the workload should hit the prefix cache";
  if (scenario.expect_preemption) {
    EXPECT_GT(stats.num_preemptions, 0);
  }
  std::printf("%s: %d requests compared (%zu aborted), %lld steps, %lld preemptions, %lld prefix-hit tokens, "
              "max |dlogprob| = %.3g\n",
              scenario.name.c_str(), compared, plan.size() - compared, static_cast<long long>(stats.num_steps),
              static_cast<long long>(stats.num_preemptions), static_cast<long long>(stats.prefix_cache_hit_tokens),
              worst);
}

// prompt_logprobs: the engine's all-position logits, over chunked prefill (budgets of 7
// and 2048 tokens) and with the prompt already in the prefix cache, equal log_softmax of
// the dense path's logits at every prompt position within 1e-3; a second sample of the
// same request decodes the same greedy tokens as a request without prompt logprobs.
TEST_F(EngineEquivalenceTest, PromptLogprobsMatchTheDensePathAtEveryPosition) {
  std::vector<int32_t> prompt;
  std::mt19937 rng(11);
  for (int i = 0; i < 45; ++i) prompt.push_back(std::uniform_int_distribution<int32_t>(1, 200)(rng));
  const model::ModelConfig& c = model_->config();
  auto cache = DenseKvCache::Create(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 64);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<int32_t> rows(prompt.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  std::vector<float> logits;
  ASSERT_TRUE(model_->Forward(prompt, *cache, rows, &logits).ok());
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);

  for (const int32_t budget : {7, 2048}) {
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = 16, .num_blocks = 64});
    ASSERT_TRUE(runner.ok()) << runner.status();
    EngineOptions options;
    options.scheduler.max_num_batched_tokens = budget;
    options.kv.block_size_tokens = 16;
    options.kv.record_events = false;
    options.max_model_len = 512;
    auto engine = Engine::Create(options, **runner);
    ASSERT_TRUE(engine.ok()) << engine.status();
    // Three times: the second and third find the prompt in the prefix cache.
    for (int round = 0; round < 3; ++round) {
      EngineRequest r;
      r.request_id = absl::StrCat("r", round);
      r.prompt_token_ids = prompt;
      r.sampling_params = Greedy(4);
      r.sampling_params.prompt_logprobs = round == 2 ? -1 : 2;
      std::vector<SampleResult> got;
      std::vector<int32_t> tokens;
      int outputs_with_prompt_logprobs = 0;
      int32_t cached = 0;
      r.on_output = [&](const RequestOutput& out) {
        cached = out.num_cached_prompt_tokens;
        if (!out.prompt_logprobs.empty()) {
          ++outputs_with_prompt_logprobs;
          got = out.prompt_logprobs;
        }
        for (const CompletionOutput& o : out.outputs) tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      };
      ASSERT_TRUE((*engine)->AddRequest(std::move(r)).ok());
      while ((*engine)->HasUnfinishedRequests()) ASSERT_TRUE((*engine)->Step().ok());
      EXPECT_EQ(tokens, Dense(prompt, 4).tokens) << "budget " << budget << " round " << round;
      if (round == 2) {
        EXPECT_EQ(outputs_with_prompt_logprobs, 0);
        EXPECT_GT(cached, 0) << "without prompt logprobs the prompt comes from the prefix cache";
        continue;
      }
      EXPECT_EQ(cached, 0) << "a request for prompt logprobs computes its whole prompt";
      EXPECT_EQ(outputs_with_prompt_logprobs, 1);
      ASSERT_EQ(got.size(), prompt.size() - 1) << "budget " << budget << " round " << round;
      for (size_t i = 0; i + 1 < prompt.size(); ++i) {
        const SampleResult want = ComputeRawLogprobs(
            std::span<const float>(logits).subspan(i * vocab, vocab), prompt[i + 1], 2);
        EXPECT_EQ(got[i].token_id, prompt[i + 1]);
        EXPECT_NEAR(*got[i].logprob, *want.logprob, 1e-3) << "position " << i << " budget " << budget;
        ASSERT_EQ(got[i].top_logprobs.size(), 2u);
        EXPECT_NEAR(got[i].top_logprobs[0].logprob, want.top_logprobs[0].logprob, 1e-3);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, EngineEquivalenceTest,
    testing::Values(Scenario{"roomy_pool_big_budget", 2048, 256, false},
                    Scenario{"chunked_prefill_16_tokens", 16, 256, false},
                    Scenario{"chunked_prefill_61_tokens", 61, 256, false},
                    Scenario{"tiny_pool_forces_preemption", 64, 12, true}),
    [](const testing::TestParamInfo<Scenario>& info) { return info.param.name; });

}  // namespace
}  // namespace kvmesh::engine
