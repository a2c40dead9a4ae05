// TensorParallelRunner (rank threads on loopback Gloo) against the single-rank
// PagedModelRunner on the same model: the same greedy tokens for a batch of 32 mixed
// requests through the Engine, logits within 1e-3, per-rank KV pools of 1/N the size
// (or replicated heads, reported by the pool's accounting), clear start-up errors for
// shapes that cannot be split, and a failing rank that breaks the group with an error
// instead of a hang.
#include "engine/tensor_parallel_runner.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/nccl_communicator.h"
#include "engine/engine.h"
#include "engine/paged_model_runner.h"
#include "runner_test_util.h"

namespace kvmesh::engine {
namespace {

using testing_util::WithinDeadline;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 128;

std::string ModelDir(const std::string& name) { return std::string(KVMESH_BINARY_DIR) + "/models/" + name; }


std::unique_ptr<TensorParallelRunner> MakeTp(const std::string& model, int32_t tp,
                                             TensorParallelRunnerOptions options = {}) {
  options.tensor_parallel_size = tp;
  options.block_size_tokens = kBlockSize;
  options.num_blocks = kNumBlocks;
  options.total_threads = 2;
  auto runner = TensorParallelRunner::Create(ModelDir(model), options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(runner).value() : nullptr;
}

// The single-rank model and runner of the comparison.
struct SingleRank {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PagedModelRunner> runner;
};

SingleRank MakeSingle(const std::string& model) {
  SingleRank s;
  s.backend = backend::CreateCpuBackend({.num_threads = 2}).value();
  s.model = LlamaModel::Load(ModelDir(model), *s.backend).value();
  s.runner = PagedModelRunner::Create(*s.model, {.block_size_tokens = kBlockSize, .num_blocks = kNumBlocks}).value();
  return s;
}

// 32 requests: 1-70 token prompts, a third sharing one of two prefixes (prefix-cache
// hits), 2-10 new tokens each, arriving over the first steps (prefills mixed with decodes).
struct Planned {
  std::vector<int32_t> prompt;
  int32_t max_tokens;
  int32_t arrival_step;
};
std::vector<Planned> MixedRequests(int32_t vocab) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::vector<int32_t>> prefixes(2);
  for (int32_t i = 0; i < 20; ++i) prefixes[0].push_back(token(rng));
  for (int32_t i = 0; i < 35; ++i) prefixes[1].push_back(token(rng));
  std::vector<Planned> plan;
  for (int i = 0; i < 32; ++i) {
    Planned p;
    if (i % 3 > 0) p.prompt = prefixes[i % 3 - 1];
    const int32_t own = std::uniform_int_distribution<int32_t>(1, 35)(rng);
    for (int32_t k = 0; k < own; ++k) p.prompt.push_back(token(rng));
    p.max_tokens = std::uniform_int_distribution<int32_t>(2, 10)(rng);
    p.arrival_step = std::uniform_int_distribution<int32_t>(0, 4)(rng);
    plan.push_back(std::move(p));
  }
  return plan;
}

// Greedy tokens per request through an Engine over `runner`.
std::vector<std::vector<int32_t>> GenerateGreedy(ModelRunner& runner, const std::vector<Planned>& plan) {
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = 256;
  options.scheduler.max_num_seqs = 32;
  options.kv.block_size_tokens = kBlockSize;
  options.kv.record_events = false;
  options.max_model_len = 256;
  auto engine = Engine::Create(options, runner).value();
  std::vector<std::vector<int32_t>> tokens(plan.size());
  size_t added = 0;
  for (int step = 0; step < 1000; ++step) {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].arrival_step != step) continue;
      EngineRequest r;
      r.request_id = std::to_string(i);
      r.prompt_token_ids = plan[i].prompt;
      r.sampling_params.temperature = 0;
      r.sampling_params.ignore_eos = true;
      r.sampling_params.max_tokens = plan[i].max_tokens;
      EXPECT_TRUE(engine->AddRequest(std::move(r)).ok());
      ++added;
    }
    if (added == plan.size() && !engine->HasUnfinishedRequests()) break;
    auto outputs = engine->Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    for (const RequestOutput& out : *outputs) {
      EXPECT_TRUE(out.status.ok()) << out.status;
      for (const CompletionOutput& c : out.outputs) {
        auto& t = tokens[std::stoul(out.request_id)];
        t.insert(t.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      }
    }
  }
  return tokens;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

struct Case {
  std::string model;
  int32_t tp;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << "_tp" << c.tp; }

class TensorParallelEquivalenceTest : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelEquivalenceTest, LogitsWithin1e3OfOneRank) {
  const Case& c = GetParam();
  SingleRank single = MakeSingle(c.model);
  auto tp = MakeTp(c.model, c.tp);
  ASSERT_NE(tp, nullptr);
  ASSERT_EQ(tp->vocab_size(), single.runner->vocab_size());
  ASSERT_EQ(tp->num_blocks(), single.runner->num_blocks());
  testing_util::RunnerSequences s{.block_size = kBlockSize};
  const ModelBatch first = testing_util::PrefillStep(tp->vocab_size(), &s);
  const ModelBatch second = testing_util::DecodeStep(tp->vocab_size(), &s);
  for (const ModelBatch* batch : {&first, &second}) {
    auto want = single.runner->Execute(*batch);
    auto got = WithinDeadline(absl::Seconds(120), "TP Execute", [&] { return tp->Execute(*batch); });
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    const float worst = MaxAbsDiff(got->logits, want->logits);
    EXPECT_LE(worst, 1e-3f);
    std::printf("%s TP=%d: max |logit difference| vs TP=1 = %.3g\n", c.model.c_str(), c.tp, worst);
  }
}

TEST_P(TensorParallelEquivalenceTest, EngineGreedyTokensMatchOneRankFor32MixedRequests) {
  const Case& c = GetParam();
  static std::map<std::string, std::vector<std::vector<int32_t>>>* single_tokens =
      new std::map<std::string, std::vector<std::vector<int32_t>>>();
  SingleRank single = MakeSingle(c.model);
  const std::vector<Planned> plan = MixedRequests(single.runner->vocab_size());
  if (!single_tokens->contains(c.model)) (*single_tokens)[c.model] = GenerateGreedy(*single.runner, plan);
  const auto& want = (*single_tokens)[c.model];
  auto tp = MakeTp(c.model, c.tp);
  ASSERT_NE(tp, nullptr);
  const auto got = WithinDeadline(absl::Seconds(300), "TP engine run", [&] { return GenerateGreedy(*tp, plan); });
  int32_t total = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    ASSERT_EQ(static_cast<int32_t>(want[i].size()), plan[i].max_tokens) << "request " << i;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
    total += static_cast<int32_t>(got[i].size());
  }
  std::printf("%s TP=%d: %zu requests, %d greedy tokens identical to TP=1\n", c.model.c_str(), c.tp, plan.size(),
              total);
}

// tiny-llama: the default model (bf16, 8 heads, 2 KV heads: replicated at TP=4).
// gqa8-f32: f32 with 8 KV heads (split 4 / 2 per rank).
INSTANTIATE_TEST_SUITE_P(Models, TensorParallelEquivalenceTest,
                         testing::Values(Case{"tiny-llama", 2}, Case{"tiny-llama", 4}, Case{"gqa8-f32", 2},
                                         Case{"gqa8-f32", 4}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.model == "tiny-llama" ? "tiny_llama" : "gqa8_f32", "_tp",
                                               info.param.tp);
                         });

TEST(TensorParallelKvTest, PerRankPoolIsOneNthOfOneRankForTheSameBlocks) {
  SingleRank single = MakeSingle("gqa8-f32");
  const kv::KvLayout& one = single.runner->storage().layout();
  EXPECT_EQ(one.num_kv_heads(), 8);
  for (int32_t n : {2, 4}) {
    auto tp = MakeTp("gqa8-f32", n);
    ASSERT_NE(tp, nullptr);
    for (int32_t r = 0; r < n; ++r) {
      const kv::KvLayout& pool = tp->rank_layout(r);
      EXPECT_EQ(pool.num_blocks(), one.num_blocks());
      EXPECT_EQ(pool.num_kv_heads(), 8 / n);
      EXPECT_EQ(pool.kv_head_replication(), 1);
      EXPECT_EQ(pool.TotalBytes() * n, single.runner->storage().size_bytes()) << "TP=" << n << " rank " << r;
      EXPECT_EQ(pool.UniqueBytes(), pool.TotalBytes());
    }
  }
}

TEST(TensorParallelKvTest, MqaReplicatesTheKvHeadAndTheAccountingShowsIt) {
  // llama3-rope-f32 has 4 query heads and a single KV head (MQA).
  SingleRank single = MakeSingle("llama3-rope-f32");
  ASSERT_EQ(single.runner->storage().layout().num_kv_heads(), 1);
  auto tp = MakeTp("llama3-rope-f32", 2);
  ASSERT_NE(tp, nullptr);
  for (int32_t r = 0; r < 2; ++r) {
    const kv::KvLayout& layout = tp->rank_layout(r);
    EXPECT_EQ(layout.num_kv_heads(), 1);
    EXPECT_EQ(layout.kv_head_replication(), 2);
    // Not halved: each rank holds the whole (replicated) head; its unique share is half.
    EXPECT_EQ(layout.TotalBytes(), single.runner->storage().size_bytes());
    EXPECT_EQ(layout.UniqueBytes() * 2, single.runner->storage().size_bytes());
  }
  EXPECT_NE(tp->DescribeSharding().find("replicated on 2 ranks"), std::string::npos) << tp->DescribeSharding();
  // And the replicated group still computes the same logits.
  testing_util::RunnerSequences s{.block_size = kBlockSize};
  const ModelBatch batch = testing_util::PrefillStep(tp->vocab_size(), &s);
  auto want = single.runner->Execute(batch);
  auto got = WithinDeadline(absl::Seconds(60), "TP Execute", [&] { return tp->Execute(batch); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LE(MaxAbsDiff(got->logits, want->logits), 1e-3f);
}

TEST(TensorParallelStartupTest, ShapesThatCannotBeSplitFailBeforeAnyRankStarts) {
  TensorParallelRunnerOptions options{.tensor_parallel_size = 3, .num_blocks = 8};
  // 4 heads over 3 ranks.
  auto three = TensorParallelRunner::Create(ModelDir("llama3-rope-f32"), options);
  ASSERT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("num_attention_heads (4) is not divisible by 3"), std::string::npos)
      << three.status();
  // 16 heads over 16 ranks split, but 8 KV heads, 512 MLP rows and a 5120 vocabulary do
  // not all go 32 ways.
  options.tensor_parallel_size = 32;
  auto many = TensorParallelRunner::Create(ModelDir("gqa8-f32"), options);
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument) << many.status();
  options.tensor_parallel_size = 2;
  options.kv_cache_bytes = 1;
  auto both = TensorParallelRunner::Create(ModelDir("gqa8-f32"), options);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorParallelStartupTest, GpuRanksNeedOneVisibleGpuPerRankAndSayWhich) {
  if (comm::NumCudaDevices() >= 2) GTEST_SKIP() << "two GPUs are here: cuda_tensor_parallel_test runs GPU ranks";
  TensorParallelRunnerOptions options{.tensor_parallel_size = 2, .num_blocks = 8, .cuda_device = 0};
  auto gpu = TensorParallelRunner::Create(ModelDir("tiny-llama"), options);
  ASSERT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
  EXPECT_NE(gpu.status().message().find("needs CUDA devices 0..1"), std::string::npos) << gpu.status();
  EXPECT_NE(gpu.status().message().find(absl::StrCat(comm::NumCudaDevices(), " visible")), std::string::npos)
      << gpu.status();
  // A memory fraction sizes GPU pools only; on CPU ranks it is refused, not ignored.
  TensorParallelRunnerOptions cpu{.tensor_parallel_size = 2, .kv_cache_memory_fraction = 0.5};
  auto refused = TensorParallelRunner::Create(ModelDir("tiny-llama"), cpu);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
}

TEST(TensorParallelFailureTest, RankThatThrowsBreaksTheGroupWithAClearErrorNotAHang) {
  std::atomic<int> failures{0};
  TensorParallelRunnerOptions options;
  options.comm_timeout = absl::Seconds(10);
  options.before_rank_step = [](int32_t rank, int64_t step) {
    if (rank == 1 && step == 2) throw std::runtime_error("injected fault on rank 1");
  };
  options.on_group_failure = [&](const absl::Status&) { ++failures; };
  auto tp = MakeTp("gqa8-f32", 2, options);
  ASSERT_NE(tp, nullptr);
  testing_util::RunnerSequences s{.block_size = kBlockSize};
  const ModelBatch first = testing_util::PrefillStep(tp->vocab_size(), &s);
  ASSERT_TRUE(tp->Execute(first).ok());
  const absl::Time start = absl::Now();
  auto failed = WithinDeadline(absl::Seconds(60), "Execute with a throwing rank",
                               [&] { return tp->Execute(testing_util::DecodeStep(tp->vocab_size(), &s)); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("rank 1: exception: injected fault on rank 1"), std::string::npos)
      << failed.status();
  // Rank 1 closed its connections: rank 0 learns at once, not at the 10 s timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_EQ(failures.load(), 1);
  EXPECT_FALSE(tp->health().ok());
  // Later steps fail at once with the same story.
  auto again = WithinDeadline(absl::Seconds(5), "Execute on a broken group", [&] { return tp->Execute(first); });
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("injected fault"), std::string::npos);
  EXPECT_EQ(failures.load(), 1);
}

TEST(TensorParallelFailureTest, StuckRankTimesOutAndTheEngineFailsItsRequests) {
  TensorParallelRunnerOptions options;
  // NOTE: generous for a loaded CI machine: the healthy first step must not time out.
  options.comm_timeout = absl::Milliseconds(1500);
  options.before_rank_step = [](int32_t rank, int64_t step) {
    // Rank 1 stalls (alive, holding its connections) on the second step.
    if (rank == 1 && step == 2) std::this_thread::sleep_for(std::chrono::seconds(4));
  };
  auto tp = MakeTp("gqa8-f32", 2, options);
  ASSERT_NE(tp, nullptr);
  EngineOptions engine_options;
  engine_options.kv.block_size_tokens = kBlockSize;
  engine_options.kv.record_events = false;
  engine_options.max_model_len = 128;
  auto engine = Engine::Create(engine_options, *tp).value();
  for (int i = 0; i < 3; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = {1, 2, 3, i + 4};
    r.sampling_params.temperature = 0;
    r.sampling_params.ignore_eos = true;
    r.sampling_params.max_tokens = 8;
    ASSERT_TRUE(engine->AddRequest(std::move(r)).ok());
  }
  const absl::Time start = absl::Now();
  int finished_with_error = 0;
  WithinDeadline(absl::Seconds(60), "engine steps with a stuck rank", [&] {
    for (int step = 0; step < 50 && engine->HasUnfinishedRequests(); ++step) {
      auto outputs = engine->Step();
      if (!outputs.ok()) continue;
      for (const RequestOutput& out : *outputs) {
        if (out.finished && !out.status.ok()) ++finished_with_error;
      }
    }
    return 0;
  });
  EXPECT_EQ(finished_with_error, 3);
  EXPECT_FALSE(engine->HasUnfinishedRequests());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_FALSE(tp->health().ok());
  std::printf("stuck rank -> %s\n", std::string(tp->health().message()).c_str());
}

}  // namespace
}  // namespace kvmesh::engine
