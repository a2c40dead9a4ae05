// The KV hierarchy end to end on the GPU (issue #11 item 9): the Engine over the CUDA
// runner, whose offloads and onboards run through kernels/swap_blocks, with a host tier
// in pinned memory or in managed memory (--kv-host-memory=uvm) and a disk tier under
// it. A request whose prefix comes from tier 0, the host tier or the disk tier (after a
// restart) gives the greedy tokens and logprobs of the same request recomputed, bit for
// bit, and nothing is stranded. Skips without a GPU (tools/gpu-check runs it on one);
// engine_tiers_test covers the same paths on the CPU runner.
#include <unistd.h>

#include <filesystem>
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

class CudaEngineTiersTest : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    testing_util::LoadTinyModelOnGpuOrSkip(&gpu_);
    model_ = gpu_.model.get();
  }

  using Worker = testing_util::GpuEngine;
  Worker MakeWorker(int32_t num_blocks, EngineKvTierOptions tiers) {
    return testing_util::MakeGpuEngine(*model_, {.block_size_tokens = kBlock, .num_blocks = num_blocks},
                                       std::move(tiers));
  }

  // The host tier's memory this test instance asks for.
  void UseHostMemory(EngineKvTierOptions& tiers) {
    auto memory = MakeCudaHostTierMemory(0, /*managed=*/std::string(GetParam()) == "managed");
    ASSERT_TRUE(memory.ok()) << memory.status();
    tiers.host_allocate = memory->allocate;
    tiers.host_deallocate = memory->deallocate;
  }

  static Generation Generate(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt) {
    return testing_util::GenerateChecked(engine, id, prompt, /*max_tokens=*/12);
  }

  testing_util::GpuTestModel gpu_;
  LlamaModel* model_ = nullptr;
};

TEST_P(CudaEngineTiersTest, PrefixFromEveryTierGivesBitIdenticalOutput) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, 250);
  auto random_prompt = [&](int n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = token(rng);
    return p;
  };
  const std::vector<int32_t> prompt = random_prompt(100);  // 6 full blocks + 4 tokens
  std::vector<std::vector<int32_t>> fillers;
  for (int i = 0; i < 3; ++i) fillers.push_back(random_prompt(180));

  Worker plain = MakeWorker(64, {});
  ASSERT_NE(plain.engine, nullptr);
  const Generation recomputed = Generate(*plain.engine, "p", prompt);
  const Generation from_device = Generate(*plain.engine, "p2", prompt);
  EXPECT_GT(plain.engine->stats().prefix_cache_hit_tokens, 0);
  ExpectIdentical(from_device, recomputed, "tier-0 prefix vs recompute");

  const std::string dir = absl::StrCat(testing::TempDir(), "/kvmesh_cuda_tiers_", GetParam(), "_", getpid());
  std::filesystem::remove_all(dir);
  const int64_t slot_bytes = plain.runner->kv_swap_bytes_per_block();
  ASSERT_GT(slot_bytes, 0);
  EngineKvTierOptions tiers{.host_cache_bytes = 64 * slot_bytes, .disk_cache_dir = dir,
                            .disk_cache_bytes = 256 * slot_bytes};
  UseHostMemory(tiers);
  {
    // A 16-block pool: the fillers evict the prompt's blocks to the host tier.
    Worker tiered = MakeWorker(16, tiers);
    ASSERT_NE(tiered.engine, nullptr);
    ExpectIdentical(Generate(*tiered.engine, "p", prompt), recomputed, "first run with tiers vs recompute");
    for (size_t i = 0; i < fillers.size(); ++i) Generate(*tiered.engine, absl::StrCat("f", i), fillers[i]);
    const EngineStats before = tiered.engine->stats();
    EXPECT_GT(before.host_tier.blocks_offloaded, 0);
    const Generation from_host = Generate(*tiered.engine, "p3", prompt);
    EXPECT_GE(tiered.engine->stats().prefix_cache_host_hit_tokens - before.prefix_cache_host_hit_tokens, 6 * kBlock)
        << "the prompt's 6 full blocks should come back from the host tier";
    ExpectIdentical(from_host, recomputed, "host-tier prefix vs recompute");
  }
  {
    // A restart: a fresh host tier; the disk tier's index is rebuilt from its files.
    Worker restarted = MakeWorker(16, tiers);
    ASSERT_NE(restarted.engine, nullptr);
    EXPECT_GT(restarted.engine->stats().disk_tier_records, 0);
    const Generation from_disk = Generate(*restarted.engine, "p4", prompt);
    EXPECT_GT(restarted.engine->stats().num_waiting_for_disk, 0) << "the prefix should have been read from disk";
    ExpectIdentical(from_disk, recomputed, "disk-tier prefix vs recompute");
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(HostMemory, CudaEngineTiersTest, testing::Values("pinned", "managed"));

}  // namespace
}  // namespace kvmesh::engine
