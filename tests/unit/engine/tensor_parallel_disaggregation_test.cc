// Prefill/decode disaggregation between two tensor-parallel engines (TP=2 on each side,
// Gloo on the CPU): the prefill engine streams each layer of each rank through its sink
// while later layers compute (TensorParallelRunner calls the hook once every rank wrote
// the layer), and the decode engine imports rank r's share into its rank r. Greedy tokens
// and logprobs must be exactly those of one aggregated TP=2 engine, and every block must
// be back on both sides. A transfer that skips one rank must not commit.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/tensor_parallel_runner.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kTp = 2;

std::unique_ptr<TensorParallelRunner> MakeTp(const std::string& model) {
  TensorParallelRunnerOptions options;
  options.tensor_parallel_size = kTp;
  options.block_size_tokens = kBlockSize;
  options.num_blocks = 128;
  options.total_threads = 2;
  auto runner = TensorParallelRunner::Create(std::string(KVMESH_BINARY_DIR) + "/models/" + model, options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(runner).value() : nullptr;
}

std::unique_ptr<Engine> MakeEngine(ModelRunner& runner) {
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = 48;  // chunked: a prompt streams over several steps
  options.scheduler.max_num_seqs = 8;
  options.kv.block_size_tokens = kBlockSize;
  options.kv.record_events = false;
  options.max_model_len = 512;
  auto engine = Engine::Create(options, runner);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

struct Got {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
  std::optional<PrefillResult> prefill;
  bool finished = false;
  absl::Status status;
};

EngineRequest Greedy(const std::string& id, std::vector<int32_t> prompt, std::map<std::string, Got>* got) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.max_tokens = 8;
  r.sampling_params.logprobs = 2;
  r.on_output = [got](const RequestOutput& o) {
    Got& g = (*got)[o.request_id];
    for (const CompletionOutput& c : o.outputs) {
      g.tokens.insert(g.tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      g.samples.insert(g.samples.end(), c.new_logprobs.begin(), c.new_logprobs.end());
    }
    if (o.prefill_result) g.prefill = o.prefill_result;
    if (o.finished) {
      g.finished = true;
      g.status = o.status;
    }
  };
  return r;
}

void RunUntil(Engine& e, const std::function<bool()>& done) {
  for (int i = 0; i < 5000 && !done(); ++i) ASSERT_TRUE(e.Step().ok());
  ASSERT_TRUE(done());
}

std::vector<int32_t> Prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back((i * 7919 + seed * 104729) % 3000 + 5);
  return v;
}

class TensorParallelDisaggregationTest : public testing::Test {
 protected:
  void SetUp() override {
    for (auto* r : {&agg_runner_, &p_runner_, &d_runner_}) {
      *r = MakeTp("tiny-llama");
      ASSERT_NE(*r, nullptr);
    }
    agg_ = MakeEngine(*agg_runner_);
    p_ = MakeEngine(*p_runner_);
    d_ = MakeEngine(*d_runner_);
    ASSERT_TRUE(agg_ && p_ && d_);
  }

  // One streamed remote prefill of `prompt` (id `id`); `drop_rank`: that rank's layers
  // are not imported (a transfer cut short on one rank).
  void Disaggregate(const std::string& id, const std::vector<int32_t>& prompt, int32_t drop_rank = -1) {
    auto lease = d_->ReserveForRemotePrefill(Greedy(id, prompt, &d_got_));
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_EQ(lease->tp_size, kTp);
    ASSERT_EQ(lease->kv_spec, p_->kv_block_spec().value());
    int64_t imported = 0;
    std::vector<int32_t> ranks_seen(kTp, 0);
    KvTransferId tid = lease->transfer_id;
    const int32_t skip = lease->num_cached_blocks();
    skipped_[id] = skip;
    KvLayerSink sink = [&](const KvLayerBlocks& b) {
      ++ranks_seen[static_cast<size_t>(b.rank)];
      if (b.rank == drop_rank) return;
      for (size_t i = 0; i < b.blocks.size(); ++i) {
        // Copies on the engine thread, as the gRPC stream does before its chunks go out.
        const std::vector<std::byte> bytes(b.blocks[i].begin(), b.blocks[i].end());
        ASSERT_TRUE(d_->ImportKvBlock(tid, b.rank, b.layer, b.first_block_index + static_cast<int32_t>(i), bytes).ok());
        ++imported;
      }
    };
    ASSERT_TRUE(p_->AddPrefillOnlyRequest(Greedy(id, prompt, &p_got_), skip * kBlockSize, sink).ok());
    RunUntil(*p_, [&] { return p_got_[id].prefill.has_value(); });
    const int32_t num_layers = lease->kv_spec.num_layers;
    EXPECT_EQ(ranks_seen[0], ranks_seen[1]);
    EXPECT_GE(ranks_seen[0], num_layers);
    const int64_t expected = int64_t{kTp} * num_layers * (lease->num_blocks() - skip);
    EXPECT_EQ(imported, drop_rank < 0 ? expected : expected / kTp);
    const PrefillResult& result = *p_got_[id].prefill;
    ASSERT_TRUE(p_->ReleasePrefill(id).ok());
    auto committed = d_->CommitRemotePrefill(tid, result.first_token_id, result.first_token_logprobs);
    if (drop_rank >= 0) {
      // Half of the (rank, layer, block) pairs never came: the sequence would attend to garbage.
      ASSERT_EQ(committed.status().code(), absl::StatusCode::kFailedPrecondition) << committed.status();
      ASSERT_TRUE(d_->FailRemotePrefill(tid, absl::DataLossError("rank cut short")).ok());
      return;
    }
    ASSERT_TRUE(committed.ok()) << committed.status();
    RunUntil(*d_, [&] { return d_got_[id].finished; });
  }

  std::unique_ptr<TensorParallelRunner> agg_runner_, p_runner_, d_runner_;
  std::unique_ptr<Engine> agg_, p_, d_;
  std::map<std::string, Got> agg_got_, p_got_, d_got_;
  std::map<std::string, int32_t> skipped_;  // the decode side's cached blocks per lease
};

TEST_F(TensorParallelDisaggregationTest, RankToRankTransferMatchesTheAggregatedGroup) {
  // The second prompt shares the first's leading 96 tokens: the decode side's prefix
  // cache serves them (skipped blocks) on the second transfer.
  std::vector<int32_t> shared = Prompt(200, 1);
  std::vector<int32_t> second = shared;
  second.resize(96);
  const std::vector<int32_t> tail = Prompt(77, 2);
  second.insert(second.end(), tail.begin(), tail.end());
  const std::vector<std::vector<int32_t>> prompts = {shared, second, Prompt(33, 3)};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = absl::StrCat("r", i);
    ASSERT_TRUE(agg_->AddRequest(Greedy(id, prompts[i], &agg_got_)).ok());
    RunUntil(*agg_, [&] { return agg_got_[id].finished; });
    Disaggregate(id, prompts[i]);
    ASSERT_TRUE(d_got_[id].status.ok()) << d_got_[id].status;
    EXPECT_EQ(d_got_[id].tokens, agg_got_[id].tokens) << id;
    ASSERT_EQ(d_got_[id].samples.size(), agg_got_[id].samples.size());
    for (size_t t = 0; t < d_got_[id].samples.size(); ++t) {
      // Bit-identical: the same group computes the same positions in the same order.
      EXPECT_EQ(d_got_[id].samples[t].logprob, agg_got_[id].samples[t].logprob) << id << " token " << t;
    }
  }
  EXPECT_EQ(skipped_["r1"], 96 / kBlockSize) << "the second prompt's shared prefix was not reused";
  EXPECT_EQ(p_->kv_cache().num_used_blocks(), 0);
  EXPECT_EQ(d_->kv_cache().num_used_blocks(), 0);
}

TEST_F(TensorParallelDisaggregationTest, ATransferMissingOneRankNeverCommits) {
  Disaggregate("cut", Prompt(100, 4), /*drop_rank=*/1);
  EXPECT_TRUE(d_got_["cut"].finished);
  EXPECT_FALSE(d_got_["cut"].status.ok());
  EXPECT_EQ(d_->kv_cache().num_used_blocks(), 0);
  // Ranks out of range are refused by both ends.
  EXPECT_EQ(p_->ExportKvBlock("nope", kTp, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvmesh::engine
