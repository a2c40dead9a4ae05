// Prefill/decode disaggregation on the real models: two Engines in one process, each
// with its own PagedModelRunner over the same model. Engine P prefills prompts
// (prefill-only, chunked, with its own prefix cache); engine D leases blocks, receives
// every layer's blocks from P (skipping those in its own prefix cache), commits P's
// first token and decodes. For prompts that share prefixes (so both sides get prefix
// hits), the greedy tokens must be exactly those of one aggregated engine running the
// same requests, the logprobs within 1e-3, and every block must be back on both sides.
// Each case runs twice: over the runners' own pools, and with both runners behind a host
// mirror (host_mirrored_runner.h), as a CUDA prefill or decode worker's runner is.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"
#include "host_mirrored_runner.h"

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
  std::unique_ptr<ModelRunner> runner;
  testing::HostMirroredRunner* mirrored = nullptr;  // runner, when behind a host mirror
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

struct Case {
  std::string model;
  bool host_mirror = false;  // the P and D runners move KV through a host mirror
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << (c.host_mirror ? " behind host mirrors" : ""); }

class DisaggregationEquivalenceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto backend = backend::CreateCpuBackend({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam().model, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
  }

  // A fresh engine over its own runner and KV pool; a transferring side (`moves_kv`)
  // behind a host mirror in the host_mirror cases.
  void MakeStack(Stack* s, int32_t max_num_batched_tokens, bool moves_kv = true) {
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = kBlockSize, .num_blocks = 256});
    ASSERT_TRUE(runner.ok()) << runner.status();
    if (moves_kv && GetParam().host_mirror) {
      auto mirrored = std::make_unique<testing::HostMirroredRunner>(std::move(runner).value());
      s->mirrored = mirrored.get();
      s->runner = std::move(mirrored);
    } else {
      s->runner = std::move(runner).value();
    }
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

std::vector<int32_t> RandomTokens(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> token(2, 3999);
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(token(rng));
  return v;
}

TEST_P(DisaggregationEquivalenceTest, DisaggregatedTokensMatchTheAggregatedEngine) {
  std::mt19937 rng(4242);
  auto tokens = [&rng](int32_t n) { return RandomTokens(rng, n); };
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
  MakeStack(&agg, 2048, /*moves_kv=*/false);
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
          absl::StatusOr<std::span<const std::byte>> bytes = p.engine->ExportKvBlock(lease.request_id, 0, layer, b);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          const absl::Status s = d.engine->ImportKvBlock(lease.transfer_id, 0, layer, b, *bytes);
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
  if (GetParam().host_mirror) {
    // Every sent block went through both mirrors, as whole blocks.
    EXPECT_GE(p.mirrored->blocks_to_mirror(), blocks_sent / model_->config().num_hidden_layers);
    EXPECT_GE(d.mirrored->blocks_from_mirror(), blocks_sent / model_->config().num_hidden_layers);
    EXPECT_EQ(p.mirrored->layer_blocks_mirrored(), 0) << "nothing streams in this case";
  }
  std::printf("%s: %lld blocks sent, %lld skipped (cached on D), P prefix-hit tokens %lld, max |dlogprob| %.3g\n",
              GetParam().model.c_str(), static_cast<long long>(blocks_sent), static_cast<long long>(blocks_skipped),
              static_cast<long long>(p.engine->stats().prefix_cache_hit_tokens), worst);
}

// The layered path: P streams each layer's finished blocks through a KvLayerSink while
// it computes (chunked: 48 tokens a step), D imports what the sink delivered. Every
// (layer, block) must arrive exactly once, before the PrefillResult, bitwise equal to
// what ExportKvBlock returns afterwards (the post-prefill path above); long prompts
// must stream over several steps; and D's greedy tokens must equal the aggregated ones.
TEST_P(DisaggregationEquivalenceTest, LayeredStreamingSendsTheSameBytesAsExportAndTheSameTokens) {
  std::mt19937 rng(99);
  auto tokens = [&rng](int32_t n) { return RandomTokens(rng, n); };
  const std::vector<int32_t> prefix = tokens(50);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = i % 2 ? prefix : std::vector<int32_t>{};
    const std::vector<int32_t> own = tokens(std::uniform_int_distribution<int32_t>(5, 150)(rng));
    prompt.insert(prompt.end(), own.begin(), own.end());
    requests.push_back(Greedy(absl::StrCat("L", i), std::move(prompt), 6));
  }
  Stack agg;
  MakeStack(&agg, 2048, /*moves_kv=*/false);
  for (const EngineRequest& r : requests) ASSERT_TRUE(agg.engine->AddRequest(agg.Track(r)).ok());
  agg.RunToCompletion();

  Stack p, d;
  MakeStack(&p, 48);
  MakeStack(&d, 2048);
  struct Streamed {
    std::map<std::pair<int32_t, int32_t>, std::vector<std::byte>> blocks;  // (layer, block index) -> bytes
    std::set<int64_t> steps;                                               // P steps that streamed some
    int32_t last_layer = -1;
  };
  std::map<std::string, Streamed> streamed;
  int64_t step = 0;
  std::vector<RemotePrefillLease> leases;
  for (const EngineRequest& r : requests) {
    absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(r));
    ASSERT_TRUE(lease.ok()) << lease.status();
    Streamed* out = &streamed[r.request_id];
    KvLayerSink sink = [out, &step](const KvLayerBlocks& layer) {
      if (!out->steps.contains(step)) out->last_layer = -1;
      EXPECT_GT(layer.layer, out->last_layer) << "layers of one step arrive in order";
      out->last_layer = layer.layer;
      out->steps.insert(step);
      for (size_t i = 0; i < layer.blocks.size(); ++i) {
        const auto key = std::make_pair(layer.layer, layer.first_block_index + static_cast<int32_t>(i));
        EXPECT_FALSE(out->blocks.contains(key)) << "layer " << key.first << " block " << key.second << " sent twice";
        out->blocks[key].assign(layer.blocks[i].begin(), layer.blocks[i].end());
      }
    };
    ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(r), lease->num_cached_tokens, std::move(sink)).ok());
    leases.push_back(*std::move(lease));
  }
  auto all_prefilled = [&] {
    for (const RemotePrefillLease& l : leases) {
      if (!p.got[l.request_id].prefill.has_value()) return false;
    }
    return true;
  };
  for (; step < 1000 && !all_prefilled(); ++step) p.Step();
  ASSERT_TRUE(all_prefilled());

  bool some_streamed_over_several_steps = false;
  for (const RemotePrefillLease& lease : leases) {
    const PrefillResult& result = *p.got[lease.request_id].prefill;
    const Streamed& got = streamed[lease.request_id];
    const int32_t num_layers = lease.kv_spec.num_layers;
    ASSERT_EQ(static_cast<int32_t>(got.blocks.size()), num_layers * (lease.num_blocks() - result.num_skipped_blocks))
        << lease.request_id;
    some_streamed_over_several_steps |= got.steps.size() > 1;
    for (const auto& [key, bytes] : got.blocks) {
      ASSERT_GE(key.second, result.num_skipped_blocks);
      absl::StatusOr<std::span<const std::byte>> exported = p.engine->ExportKvBlock(lease.request_id, 0, key.first, key.second);
      ASSERT_TRUE(exported.ok()) << exported.status();
      ASSERT_EQ(bytes.size(), exported->size());
      ASSERT_EQ(std::memcmp(bytes.data(), exported->data(), bytes.size()), 0)
          << lease.request_id << " layer " << key.first << " block " << key.second << " differs from ExportKvBlock";
      ASSERT_TRUE(d.engine->ImportKvBlock(lease.transfer_id, 0, key.first, key.second, bytes).ok());
    }
    ASSERT_TRUE(p.engine->ReleasePrefill(lease.request_id).ok());
    ASSERT_TRUE(d.engine->CommitRemotePrefill(lease.transfer_id, result.first_token_id, result.first_token_logprobs).ok());
  }
  EXPECT_TRUE(some_streamed_over_several_steps) << "a chunked prompt should stream as its chunks complete";
  if (GetParam().host_mirror) {
    int64_t sent = 0;
    for (const auto& [id, got] : streamed) sent += static_cast<int64_t>(got.blocks.size());
    // Streamed (layer, block) pairs reached the mirror during the steps; P's whole
    // blocks were copied again for ExportKvBlock only if no step streamed them.
    EXPECT_EQ(p.mirrored->layer_blocks_mirrored(), sent);
    EXPECT_EQ(p.mirrored->blocks_to_mirror(), 0);
    EXPECT_GT(d.mirrored->blocks_from_mirror(), 0);
  }
  d.RunToCompletion();
  for (const EngineRequest& r : requests) {
    ASSERT_EQ(d.got[r.request_id].num_final, 1);
    EXPECT_TRUE(d.got[r.request_id].status.ok()) << d.got[r.request_id].status;
    EXPECT_EQ(d.got[r.request_id].tokens, agg.got[r.request_id].tokens) << "request " << r.request_id;
  }
  for (Stack* s : {&p, &d}) {
    EXPECT_EQ(s->engine->kv_cache().num_used_blocks(), 0);
    const absl::Status inv = s->engine->kv_cache().CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DisaggregationEquivalenceTest,
                         ::testing::Values(Case{"llama-f32"}, Case{"tiny-llama"}, Case{"llama-f32", true},
                                           Case{"tiny-llama", true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.model + (info.param.host_mirror ? "_host_mirror" : "");
                           for (char& c : name) c = (c == '-') ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace kvmesh::engine
