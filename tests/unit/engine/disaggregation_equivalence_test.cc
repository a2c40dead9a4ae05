// Prefill/decode disaggregation on the real models: two Engines in one process, each
// with its own PagedModelRunner over the same model. Engine P prefills prompts
// (prefill-only, chunked, with its own prefix cache); engine D leases blocks, receives
// every layer's blocks from P (skipping those in its own prefix cache), commits P's
// first token and decodes. For prompts that share prefixes (so both sides get prefix
// hits), the greedy tokens must be exactly those of one aggregated engine running the
// same requests, the logprobs within 1e-3, and every block must be back on both sides.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kTopLogprobs = 3;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
  int32_t num_final = 0;
  absl::Status status;
  std::optional<PrefillResult> prefill;
};

struct Stack {
  std::unique_ptr<PagedModelRunner> runner;
  std::unique_ptr<Engine> engine;
  std::map<std::string, Collected> got;

  EngineRequest Track(EngineRequest r) {
    r.on_output = [this](const RequestOutput& o) {
      Collected& c = got[o.request_id];
      EXPECT_EQ(c.num_final, 0) << o.request_id << " got an output after its final one";
      for (const CompletionOutput& out : o.outputs) {
        c.tokens.insert(c.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
        c.samples.insert(c.samples.end(), out.new_logprobs.begin(), out.new_logprobs.end());
      }
      if (o.prefill_result.has_value()) c.prefill = o.prefill_result;
      if (o.finished) {
        ++c.num_final;
        c.status = o.status;
      }
    };
    return r;
  }
  void Step() {
    auto outs = engine->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    const absl::Status inv = engine->scheduler().CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
  }
  void RunToCompletion() {
    for (int i = 0; i < 20000 && engine->HasUnfinishedRequests(); ++i) Step();
    ASSERT_FALSE(engine->HasUnfinishedRequests());
  }
};

class DisaggregationEquivalenceTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto backend = backend::CreateCpuBackend({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
  }

  // A fresh engine over its own runner and KV pool.
  void MakeStack(Stack* s, int32_t max_num_batched_tokens, int32_t num_blocks = 256) {
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = kBlockSize, .num_blocks = num_blocks});
    ASSERT_TRUE(runner.ok()) << runner.status();
    s->runner = std::move(runner).value();
    EngineOptions options;
    options.scheduler.max_num_batched_tokens = max_num_batched_tokens;
    options.scheduler.max_num_seqs = 16;
    options.kv.block_size_tokens = kBlockSize;
    options.kv.record_events = false;
    options.max_model_len = 512;
    auto engine = Engine::Create(options, *s->runner);
    ASSERT_TRUE(engine.ok()) << engine.status();
    s->engine = std::move(engine).value();
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

EngineRequest Greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.max_tokens = max_tokens;
  r.sampling_params.logprobs = kTopLogprobs;
  return r;
}

TEST_P(DisaggregationEquivalenceTest, DisaggregatedTokensMatchTheAggregatedEngine) {
  std::mt19937 rng(4242);
  std::uniform_int_distribution<int32_t> token(2, 3999);
  auto tokens = [&](int32_t n) {
    std::vector<int32_t> v;
    for (int32_t i = 0; i < n; ++i) v.push_back(token(rng));
    return v;
  };
  // Two shared prefixes (40 and 70 tokens: 2 and 4 full blocks plus a partial one).
  const std::vector<std::vector<int32_t>> prefixes = {tokens(40), tokens(70)};
  std::vector<std::vector<EngineRequest>> waves(2);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt;
    if (i % 3 > 0) prompt = prefixes[i % 3 - 1];
    const std::vector<int32_t> own = tokens(std::uniform_int_distribution<int32_t>(1, 45)(rng));
    prompt.insert(prompt.end(), own.begin(), own.end());
    const int32_t max_tokens = std::uniform_int_distribution<int32_t>(3, 14)(rng);
    waves[i < 4 ? 0 : 1].push_back(Greedy(std::to_string(i), std::move(prompt), max_tokens));
  }

  // 1. Aggregated: one engine runs everything.
  Stack agg;
  MakeStack(&agg, 2048);
  for (const auto& wave : waves) {
    for (const EngineRequest& r : wave) ASSERT_TRUE(agg.engine->AddRequest(agg.Track(r)).ok());
  }
  agg.RunToCompletion();

  // 2. Disaggregated: P prefills (chunked: 48 tokens a step), D decodes. Wave 2 arrives
  // while D is still decoding wave 1, whose committed prompts D has cached by then.
  Stack p, d;
  MakeStack(&p, 48);
  MakeStack(&d, 2048);
  int64_t cached_on_d = 0, blocks_sent = 0, blocks_skipped = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    std::vector<RemotePrefillLease> leases;
    for (const EngineRequest& r : waves[w]) {
      absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(r));
      ASSERT_TRUE(lease.ok()) << lease.status();
      cached_on_d += lease->num_cached_tokens;
      ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(r), lease->num_cached_tokens).ok());
      leases.push_back(*std::move(lease));
    }
    auto all_prefilled = [&] {
      for (const RemotePrefillLease& l : leases) {
        if (!p.got[l.request_id].prefill.has_value()) return false;
      }
      return true;
    };
    for (int i = 0; i < 1000 && !all_prefilled(); ++i) p.Step();
    ASSERT_TRUE(all_prefilled());
    const kv::KvBlockSpec sender = p.engine->kv_block_spec().value();
    for (const RemotePrefillLease& lease : leases) {
      ASSERT_TRUE(kv::CheckKvBlockSpecsMatch(sender, lease.kv_spec).ok());
      const PrefillResult& result = *p.got[lease.request_id].prefill;
      ASSERT_EQ(result.block_ids.size(), lease.block_ids.size());
      ASSERT_EQ(result.num_skipped_blocks, lease.num_cached_blocks());
      for (int32_t layer = 0; layer < lease.kv_spec.num_layers; ++layer) {
        for (int32_t b = result.num_skipped_blocks; b < lease.num_blocks(); ++b) {
          absl::StatusOr<std::span<const std::byte>> bytes = p.engine->ExportKvBlock(lease.request_id, layer, b);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          const absl::Status s = d.engine->ImportKvBlock(lease.transfer_id, layer, b, *bytes);
          ASSERT_TRUE(s.ok()) << s;
          ++blocks_sent;
        }
      }
      blocks_skipped += lease.num_cached_blocks();
      ASSERT_TRUE(p.engine->ReleasePrefill(lease.request_id).ok());
      absl::StatusOr<RequestOutput> committed =
          d.engine->CommitRemotePrefill(lease.transfer_id, result.first_token_id, result.first_token_logprobs);
      ASSERT_TRUE(committed.ok()) << committed.status();
    }
    // Decode a few steps of this wave before the next arrives.
    for (int i = 0; i < 3; ++i) d.Step();
  }
  d.RunToCompletion();

  // 3. Same tokens, close logprobs, nothing leaked.
  float worst = 0;
  for (const auto& wave : waves) {
    for (const EngineRequest& r : wave) {
      const Collected& want = agg.got[r.request_id];
      const Collected& have = d.got[r.request_id];
      ASSERT_EQ(want.num_final, 1);
      ASSERT_EQ(have.num_final, 1) << r.request_id;
      EXPECT_TRUE(have.status.ok()) << have.status;
      EXPECT_EQ(p.got[r.request_id].num_final, 1);
      ASSERT_EQ(have.tokens, want.tokens) << "request " << r.request_id;
      ASSERT_EQ(have.samples.size(), want.samples.size());
      for (size_t t = 0; t < want.samples.size(); ++t) {
        const float diff = std::fabs(*have.samples[t].logprob - *want.samples[t].logprob);
        worst = std::max(worst, diff);
        for (size_t k = 0; k < want.samples[t].top_logprobs.size(); ++k) {
          EXPECT_EQ(have.samples[t].top_logprobs[k].token_id, want.samples[t].top_logprobs[k].token_id);
          worst = std::max(worst, std::fabs(have.samples[t].top_logprobs[k].logprob -
                                            want.samples[t].top_logprobs[k].logprob));
        }
      }
    }
  }
  EXPECT_LE(worst, 1e-3f);
  for (Stack* s : {&agg, &p, &d}) {
    EXPECT_EQ(s->engine->kv_cache().num_used_blocks(), 0);
    EXPECT_EQ(s->engine->kv_cache().num_requests(), 0);
    const absl::Status inv = s->engine->kv_cache().CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
  }
  EXPECT_GT(cached_on_d, 0) << "the decode side should reuse its own prefix cache";
  EXPECT_GT(p.engine->stats().prefix_cache_hit_tokens, 0) << "the prefill side should reuse its prefix cache";
  EXPECT_EQ(d.engine->stats().num_leases_committed, 10);
  EXPECT_EQ(d.engine->stats().num_prefill_tokens, 0) << "D computes no prompt tokens for n == 1 requests";
  std::printf("%s: %lld blocks sent, %lld skipped (cached on D), P prefix-hit tokens %lld, max |dlogprob| %.3g\n",
              GetParam().c_str(), static_cast<long long>(blocks_sent), static_cast<long long>(blocks_skipped),
              static_cast<long long>(p.engine->stats().prefix_cache_hit_tokens), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, DisaggregationEquivalenceTest, testing::Values("llama-f32", "tiny-llama"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) c = (c == '-') ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace kvmesh::engine
