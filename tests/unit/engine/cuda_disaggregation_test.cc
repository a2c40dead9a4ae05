// Prefill/decode disaggregation between two CUDA runners (issue #12 item 5): each keeps a
// pinned host mirror of its device pool (CudaModelRunnerOptions::host_kv_mirror), which is
// all the KV transports see. Engine P prefills, its blocks reach the mirror (after the
// prefill, or layer by layer while it computes when streamed), engine D imports them into
// its mirror and copies them into its device pool when it commits. D's greedy tokens and
// logprobs must be those of one aggregated engine on the same GPU, bit for bit, and no
// block may be left used on either side. Skips without a GPU (tools/gpu-check runs it on
// one); disaggregation_equivalence_test covers the engine's side of the same protocol on
// the CPU (its host_mirror cases).
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "backend/ops.h"
#include "engine/cuda_model_runner.h"
#include "engine/engine.h"
#include "engine/llama_model.h"
#include "generation_checks.h"
#include "gpu_test_model.h"

namespace kvmesh::engine {
namespace {

using testing_util::ExpectIdentical;
using testing_util::Generation;

constexpr int32_t kBlock = 16;

class CudaDisaggregationTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    testing_util::LoadTinyModelOnGpuOrSkip(&gpu_);
    model_ = gpu_.model.get();
  }

  testing_util::GpuEngine MakeWorker(bool host_kv_mirror) {
    return testing_util::MakeGpuEngine(*model_,
                                       {.block_size_tokens = kBlock, .num_blocks = 64, .host_kv_mirror = host_kv_mirror});
  }

  testing_util::GpuTestModel gpu_;
  LlamaModel* model_ = nullptr;
};

TEST_P(CudaDisaggregationTest, DecodeAfterARemotePrefillEqualsTheAggregatedEngine) {
  const bool streamed = GetParam();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, 250);
  testing_util::GpuEngine agg = MakeWorker(false), p = MakeWorker(true), d = MakeWorker(true);
  ASSERT_NE(agg.engine, nullptr);
  ASSERT_NE(p.engine, nullptr);
  ASSERT_NE(d.engine, nullptr);
  EXPECT_EQ(agg.runner->kv_rank_storages().size(), 0u) << "no mirror unless asked for";
  ASSERT_EQ(p.runner->kv_rank_storages().size(), 1u);
  ASSERT_TRUE(agg.engine->kv_block_spec().ok()) << "a runner without a mirror still has a block spec";

  // 40, 100 and 200 tokens: a partial block, several blocks, and (at 256-token steps) one
  // prefill step each; the same step shapes as the aggregated engine's prefill.
  for (const int n : {40, 100, 200}) {
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int32_t& t : prompt) t = token(rng);
    const std::string id = absl::StrCat("r", n);
    const Generation want = testing_util::GenerateChecked(*agg.engine, id, prompt, /*max_tokens=*/10);

    EngineRequest request;
    request.request_id = id;
    request.prompt_token_ids = prompt;
    request.sampling_params = testing_util::GreedyWithLogprobs(10);
    Generation got;
    request.on_output = [&got](const RequestOutput& o) {
      for (const CompletionOutput& c : o.outputs) {
        got.tokens.insert(got.tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
        got.samples.insert(got.samples.end(), c.new_logprobs.begin(), c.new_logprobs.end());
      }
    };
    absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(request);
    ASSERT_TRUE(lease.ok()) << lease.status();
    std::optional<PrefillResult> prefilled;
    EngineRequest prefill = request;
    prefill.on_output = [&prefilled](const RequestOutput& o) {
      if (o.prefill_result.has_value()) prefilled = o.prefill_result;
    };
    int64_t layers_streamed = 0;
    KvLayerSink sink;
    if (streamed) {
      // Straight into D's mirror, as the UCX transport writes it.
      sink = [&](const KvLayerBlocks& layer) {
        for (size_t i = 0; i < layer.blocks.size(); ++i) {
          const absl::Status s = d.engine->ImportKvBlock(lease->transfer_id, layer.rank, layer.layer,
                                                         layer.first_block_index + static_cast<int32_t>(i),
                                                         layer.blocks[i]);
          EXPECT_TRUE(s.ok()) << s;
        }
        ++layers_streamed;
      };
    }
    ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(prefill, lease->num_cached_tokens, std::move(sink)).ok());
    for (int i = 0; i < 100 && !prefilled.has_value(); ++i) ASSERT_TRUE(p.engine->Step().ok());
    ASSERT_TRUE(prefilled.has_value());
    if (streamed) {
      EXPECT_GE(layers_streamed, lease->kv_spec.num_layers);
    } else {
      for (int32_t layer = 0; layer < lease->kv_spec.num_layers; ++layer) {
        for (int32_t b = prefilled->num_skipped_blocks; b < lease->num_blocks(); ++b) {
          absl::StatusOr<std::span<const std::byte>> bytes = p.engine->ExportKvBlock(id, 0, layer, b);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          ASSERT_TRUE(d.engine->ImportKvBlock(lease->transfer_id, 0, layer, b, *bytes).ok());
        }
      }
    }
    ASSERT_TRUE(p.engine->ReleasePrefill(id).ok());
    absl::StatusOr<RequestOutput> committed =
        d.engine->CommitRemotePrefill(lease->transfer_id, prefilled->first_token_id, prefilled->first_token_logprobs);
    ASSERT_TRUE(committed.ok()) << committed.status();
    for (int i = 0; i < 200 && d.engine->HasUnfinishedRequests(); ++i) ASSERT_TRUE(d.engine->Step().ok());
    ASSERT_FALSE(d.engine->HasUnfinishedRequests());
    ExpectIdentical(got, want, streamed ? "streamed remote prefill vs aggregated" : "remote prefill vs aggregated");
  }
  for (testing_util::GpuEngine* w : {&p, &d}) {
    EXPECT_EQ(w->engine->kv_cache().num_used_blocks(), 0);
    EXPECT_EQ(w->engine->stats().num_kv_blocks_stranded, 0);
  }
  EXPECT_EQ(d.engine->stats().num_leases_committed, 3);
}

INSTANTIATE_TEST_SUITE_P(Transfer, CudaDisaggregationTest, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Streamed") : std::string("AfterThePrefill");
                         });

}  // namespace
}  // namespace kvmesh::engine
