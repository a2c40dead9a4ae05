// Test helpers shared by the engine's end-to-end KV tests (engine_tiers_test on the CPU
// runner, cuda_engine_tiers_test on the GPU): run one greedy request to its end while
// checking the KV owner after every step, and compare two runs bit for bit.
#pragma once

#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"

namespace kvmesh::engine::testing_util {

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
};

// The engine these tests run: small steps (256 tokens, 4 sequences), no KV events,
// `block_size_tokens` blocks, the given lower tiers.
inline std::unique_ptr<Engine> MakeSmallStepEngine(ModelRunner& runner, EngineKvTierOptions tiers,
                                                   int32_t block_size_tokens) {
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = 256;
  options.scheduler.max_num_seqs = 4;
  options.kv.block_size_tokens = block_size_tokens;
  options.kv.record_events = false;
  options.max_model_len = 512;
  options.tiers = std::move(tiers);
  auto engine = Engine::Create(options, runner);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// Greedy, ignore_eos, 3 top logprobs per token.
inline SamplingParams GreedyWithLogprobs(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 3;
  return p;
}

// Runs requests (id, prompt) side by side to their ends on `engine`, checking the KV
// owner's invariants and that nothing is stranded after every step. By id.
inline std::map<std::string, Generation> GenerateTogether(
    Engine& engine, const std::vector<std::pair<std::string, std::vector<int32_t>>>& requests, int32_t max_tokens) {
  std::map<std::string, Generation> runs;
  for (const auto& [id, prompt] : requests) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_token_ids = prompt;
    r.sampling_params = GreedyWithLogprobs(max_tokens);
    EXPECT_TRUE(engine.AddRequest(std::move(r)).ok());
  }
  for (int step = 0; step < 2000 && engine.HasUnfinishedRequests(); ++step) {
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    for (const RequestOutput& out : *outputs) {
      Generation& run = runs[out.request_id];
      for (const CompletionOutput& c : out.outputs) {
        run.tokens.insert(run.tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
        run.samples.insert(run.samples.end(), c.new_logprobs.begin(), c.new_logprobs.end());
      }
    }
    EXPECT_TRUE(engine.kv_cache().CheckInvariants().ok()) << engine.kv_cache().CheckInvariants();
    EXPECT_EQ(engine.stats().num_kv_blocks_stranded, 0);
    if (!engine.stats().has_disk_tier && engine.stats().num_waiting_for_disk == 0) continue;
    // Disk reads complete asynchronously: give them a moment between steps.
    if (engine.stats().num_running_seqs == 0) usleep(1000);
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return runs;
}

// One request: GenerateTogether alone.
inline Generation GenerateChecked(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt,
                                  int32_t max_tokens) {
  return GenerateTogether(engine, {{id, prompt}}, max_tokens)[id];
}

// Bitwise: the same tokens and the same float logprobs, top-k included.
inline void ExpectIdentical(const Generation& got, const Generation& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.samples.size(), want.samples.size()) << what;
  for (size_t i = 0; i < want.samples.size(); ++i) {
    EXPECT_EQ(*got.samples[i].logprob, *want.samples[i].logprob) << what << ", token " << i;
    ASSERT_EQ(got.samples[i].top_logprobs.size(), want.samples[i].top_logprobs.size()) << what;
    for (size_t k = 0; k < want.samples[i].top_logprobs.size(); ++k) {
      EXPECT_EQ(got.samples[i].top_logprobs[k].token_id, want.samples[i].top_logprobs[k].token_id) << what;
      EXPECT_EQ(got.samples[i].top_logprobs[k].logprob, want.samples[i].top_logprobs[k].logprob) << what;
    }
  }
}

}  // namespace kvmesh::engine::testing_util
