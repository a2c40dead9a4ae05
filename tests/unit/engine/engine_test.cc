#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/cache_salt.h"
#include "engine/request_validator.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace kvmesh::engine {
namespace {

using testing::FakeModelRunner;
using testing::ReferenceCompletion;

constexpr int32_t kBs = testing::kTestBlockSize;
constexpr int32_t kVocab = testing::kTestVocab;

std::vector<int32_t> Prompt(int32_t n, int32_t start = 1) { return testing::TestPrompt(n, start); }
SamplingParams Greedy(int32_t max_tokens) { return testing::GreedyParams(max_tokens); }

SamplingParams Seeded(int32_t max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, SamplingParams params, int32_t n = 1) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params = params;
  r.n = n;
  return r;
}

std::vector<int32_t> Reference(const EngineRequest& r, int32_t index) {
  SamplingParams p = r.sampling_params;
  if (p.seed.has_value()) p.seed = *p.seed + static_cast<uint64_t>(index);
  return ReferenceCompletion(r.prompt_token_ids, p, r.eos_token_ids, kVocab);
}

EngineOptions Options(int32_t num_blocks, int32_t max_model_len = 64) {
  EngineOptions o;
  o.kv.num_blocks = num_blocks;
  o.kv.block_size_tokens = kBs;
  o.max_model_len = max_model_len;
  return o;
}

// Drives an engine and records everything it emits, checking the output contract: each
// request's outputs are consistent deltas and exactly one is final.
struct Driver {
  // With `keeps_block_tables`, the runner keeps tables and the scheduler sends deltas.
  Driver(const EngineOptions& options, int32_t runner_blocks = 64, bool keeps_block_tables = false)
      : runner(kVocab, kBs, runner_blocks) {
    runner.set_keeps_block_tables(keeps_block_tables);
    engine = Engine::Create(options, runner).value();
  }

  absl::Status Add(EngineRequest r) {
    const std::string id = r.request_id;
    EngineRequest copy = r;
    absl::Status s = engine->AddRequest(std::move(r));
    if (s.ok()) requests[id] = copy;
    return s;
  }

  void Record(const RequestOutput& o) {
    EXPECT_EQ(num_final[o.request_id], 0) << o.request_id << " got an output after its final one";
    for (const CompletionOutput& c : o.outputs) {
      std::vector<int32_t>& tokens = completions[o.request_id][c.index];
      tokens.insert(tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      if (c.finished()) reasons[o.request_id][c.index] = c.finish_reason;
    }
    if (o.finished) {
      ++num_final[o.request_id];
      statuses[o.request_id] = o.status;
    }
  }

  std::vector<RequestOutput> Step() {
    absl::StatusOr<std::vector<RequestOutput>> outs = engine->Step();
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) return {};
    for (const RequestOutput& o : *outs) Record(o);
    absl::Status inv = engine->scheduler().CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    return *outs;
  }

  void RunToCompletion(int32_t max_steps = 20000) {
    for (int32_t i = 0; i < max_steps && engine->HasUnfinishedRequests(); ++i) Step();
    ASSERT_FALSE(engine->HasUnfinishedRequests());
  }

  void ExpectReference(const std::string& id) {
    const EngineRequest& r = requests.at(id);
    for (int32_t i = 0; i < r.n; ++i) EXPECT_EQ(completions[id][i], Reference(r, i)) << id << " sample " << i;
  }

  void ExpectKvEmpty() {
    EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
    EXPECT_EQ(engine->kv_cache().num_requests(), 0);
    EXPECT_EQ(engine->kv_cache().num_free_blocks() + engine->kv_cache().num_cached_blocks(),
              engine->kv_cache().num_blocks());
    EXPECT_TRUE(engine->kv_cache().CheckInvariants().ok());
  }

  FakeModelRunner runner;
  std::unique_ptr<Engine> engine;
  std::map<std::string, EngineRequest> requests;
  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> completions;
  std::map<std::string, std::map<int32_t, CompletionFinishReason>> reasons;
  std::map<std::string, int32_t> num_final;
  std::map<std::string, absl::Status> statuses;
};

TEST(EngineTest, CreateRejectsInconsistentOptions) {
  FakeModelRunner runner(kVocab, kBs, 16);
  EngineOptions o = Options(16);
  o.max_model_len = 0;
  EXPECT_EQ(Engine::Create(o, runner).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(16);
  o.kv.block_size_tokens = 16;
  EXPECT_EQ(Engine::Create(o, runner).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(17);
  EXPECT_EQ(Engine::Create(o, runner).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(16);
  o.scheduler.enable_chunked_prefill = false;
  o.scheduler.max_num_batched_tokens = 32;  // < max_model_len 64
  EXPECT_EQ(Engine::Create(o, runner).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(0);  // the runner's pool
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o, runner);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->kv_cache().num_blocks(), 16);
}

TEST(EngineTest, ConcurrentRequestsProduceTheirReferenceTokens) {
  Driver d(Options(64), 64);
  ASSERT_TRUE(d.Add(Req("greedy", Prompt(7), Greedy(12))).ok());
  ASSERT_TRUE(d.Add(Req("seeded", Prompt(11, 4), Seeded(15, 99))).ok());
  EngineRequest eos = Req("eos", Prompt(3, 9), Seeded(40, 5));
  eos.eos_token_ids = {0, 1, 2};
  ASSERT_TRUE(d.Add(eos).ok());
  d.RunToCompletion();
  for (const auto& [id, r] : d.requests) {
    d.ExpectReference(id);
    EXPECT_EQ(d.num_final[id], 1);
  }
  EXPECT_EQ(d.reasons["greedy"][0], CompletionFinishReason::kLength);
  d.ExpectKvEmpty();
  EXPECT_EQ(d.engine->stats().num_finished_requests, 3);
}

// A runner that returns greedy tokens itself gets argmax_only chunks exactly for the samples
// whose next token is the plain argmax (greedy, no logprobs, penalties or pending
// min_tokens mask, n == 1), and every request still produces its reference tokens.
TEST(EngineTest, ArgmaxOnlyChunksGoToARunnerThatReturnsArgmaxAndGiveTheSameTokens) {
  Driver d(Options(64), 64);
  d.runner.set_returns_argmax(true);
  d.engine = Engine::Create(Options(64), d.runner).value();  // the scheduler reads returns_argmax at Create
  ASSERT_TRUE(d.Add(Req("greedy", Prompt(7), Greedy(12))).ok());
  ASSERT_TRUE(d.Add(Req("seeded", Prompt(11, 4), Seeded(15, 99))).ok());
  EngineRequest logprobs = Req("logprobs", Prompt(5, 2), Greedy(6));
  logprobs.sampling_params.logprobs = 2;
  ASSERT_TRUE(d.Add(logprobs).ok());
  EngineRequest penalized = Req("penalized", Prompt(6, 3), Greedy(6));
  penalized.sampling_params.repetition_penalty = 1.3f;
  ASSERT_TRUE(d.Add(penalized).ok());
  EngineRequest min_tokens = Req("min_tokens", Prompt(4, 5), Greedy(8));
  min_tokens.sampling_params.min_tokens = 3;
  min_tokens.eos_token_ids = {7};
  min_tokens.sampling_params.ignore_eos = false;
  ASSERT_TRUE(d.Add(min_tokens).ok());
  ASSERT_TRUE(d.Add(Req("n2", Prompt(5, 6), Greedy(4), /*n=*/2)).ok());
  d.RunToCompletion();
  for (const auto& [id, r] : d.requests) {
    d.ExpectReference(id);
    EXPECT_EQ(d.num_final[id], 1) << id;
  }
  // greedy: all 12 samples by argmax; min_tokens: every sample after its first 3 (those
  // run under the EOS mask); the others never (seeded, logprobs, penalties, n == 2).
  int argmax_chunks = 0, logits_chunks = 0;
  for (const ModelBatch& batch : d.runner.batches()) {
    for (const SequenceChunk& chunk : batch.chunks) {
      if (chunk.compute_logits) ++(chunk.argmax_only ? argmax_chunks : logits_chunks);
    }
  }
  const int min_tokens_outputs = static_cast<int>(d.completions["min_tokens"][0].size());
  ASSERT_GE(min_tokens_outputs, 3);
  EXPECT_EQ(argmax_chunks, 12 + (min_tokens_outputs - 3));
  EXPECT_EQ(logits_chunks, 15 + 6 + 6 + 3 + (1 + 2 * 3));  // n2: one shared first row, then 3 per sample
  d.ExpectKvEmpty();
}

TEST(EngineTest, StreamingCallbackSeesEveryTokenAndOneFinalOutput) {
  Driver d(Options(64));
  std::vector<int32_t> streamed;
  int32_t finals = 0;
  EngineRequest r = Req("s", Prompt(5), Greedy(6));
  r.on_output = [&](const RequestOutput& o) {
    ASSERT_EQ(o.request_id, "s");
    ASSERT_EQ(finals, 0);
    for (const CompletionOutput& c : o.outputs) streamed.insert(streamed.end(), c.new_token_ids.begin(),
                                                                c.new_token_ids.end());
    if (o.finished) ++finals;
  };
  ASSERT_TRUE(d.Add(r).ok());
  d.RunToCompletion();
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(streamed, d.completions["s"][0]);
  EXPECT_EQ(streamed.size(), 6u);
}

TEST(EngineTest, OutputsCarryTheRequestsMilestonesInOrder) {
  Driver d(Options(64));
  using TimePoint = std::chrono::steady_clock::time_point;
  std::vector<RequestTimes> seen;
  RequestTimes final_times;
  EngineRequest r = Req("t", Prompt(5), Greedy(4));
  r.on_output = [&](const RequestOutput& o) {
    seen.push_back(o.times);
    if (o.finished) final_times = o.times;
  };
  const TimePoint before = std::chrono::steady_clock::now();
  ASSERT_TRUE(d.Add(r).ok());
  d.RunToCompletion();
  const TimePoint after = std::chrono::steady_clock::now();
  ASSERT_FALSE(seen.empty());
  EXPECT_GE(final_times.arrival, before);
  EXPECT_GE(final_times.first_scheduled, final_times.arrival);
  EXPECT_GE(final_times.first_token, final_times.first_scheduled);
  EXPECT_GE(final_times.finished, final_times.first_token);
  EXPECT_LE(final_times.finished, after);
  EXPECT_NE(final_times.first_token, TimePoint{});
  // Milestones are stamped once: every output reports the same arrival and first
  // token, and only the final one has a finish time.
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].arrival, final_times.arrival);
    EXPECT_EQ(seen[i].first_token, final_times.first_token);
    EXPECT_EQ(seen[i].finished == TimePoint{}, i + 1 < seen.size());
  }
}

TEST(EngineTest, LogprobsAreReportedPerTokenWhenRequested) {
  Driver d(Options(64));
  SamplingParams p = Greedy(4);
  p.logprobs = 3;
  std::vector<SampleResult> seen;
  EngineRequest r = Req("lp", Prompt(5), p);
  r.on_output = [&](const RequestOutput& o) {
    for (const CompletionOutput& c : o.outputs) {
      ASSERT_EQ(c.new_logprobs.size(), c.new_token_ids.size());
      seen.insert(seen.end(), c.new_logprobs.begin(), c.new_logprobs.end());
    }
  };
  ASSERT_TRUE(d.Add(r).ok());
  d.RunToCompletion();
  ASSERT_EQ(seen.size(), 4u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].token_id, d.completions["lp"][0][i]);
    EXPECT_TRUE(seen[i].logprob.has_value());
    EXPECT_EQ(seen[i].rank, 1);  // greedy picks the top token
    EXPECT_EQ(seen[i].top_logprobs.size(), 3u);
  }
}

// Every AddRequest error leaves the engine exactly as it was.
TEST(EngineTest, AddRequestRejectsBadRequestsWithoutSideEffects) {
  Driver d(Options(/*num_blocks=*/16, /*max_model_len=*/40), 16);
  ASSERT_TRUE(d.Add(Req("live", Prompt(6), Greedy(4))).ok());
  d.Step();
  const EngineStats before = d.engine->stats();
  struct Case {
    std::string name;
    EngineRequest request;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"empty prompt", Req("x", {}, Greedy(4)), absl::StatusCode::kInvalidArgument, "at least one token"});
  cases.push_back(
      {"token >= vocab", Req("x", {1, kVocab}, Greedy(4)), absl::StatusCode::kInvalidArgument, "outside the vocab"});
  cases.push_back({"negative token", Req("x", {-1}, Greedy(4)), absl::StatusCode::kInvalidArgument, "outside"});
  cases.push_back({"prompt > max_model_len", Req("x", Prompt(41), Greedy(1)), absl::StatusCode::kInvalidArgument,
                   "The decoder prompt (length 41) is longer than the maximum model length of 40."});
  cases.push_back({"prompt + max_tokens > max_model_len", Req("x", Prompt(30), Greedy(11)),
                   absl::StatusCode::kInvalidArgument,
                   "This model's maximum context length is 40 tokens. However, you requested 41 tokens (30 in the "
                   "messages, 11 in the completion)."});
  SamplingParams bad = Greedy(4);
  bad.top_p = 0.0f;
  cases.push_back({"bad sampling params", Req("x", Prompt(4), bad), absl::StatusCode::kInvalidArgument, "top_p"});
  cases.push_back({"n = 0", Req("x", Prompt(4), Greedy(4), 0), absl::StatusCode::kInvalidArgument, "n must"});
  cases.push_back(
      {"n > max_num_seqs", Req("x", Prompt(4), Greedy(4), 65), absl::StatusCode::kInvalidArgument, "max_num_seqs"});
  // 16 blocks of 4: 3 samples of 8 + 20 tokens need 2 shared + 3 * 5 = 17 blocks.
  cases.push_back({"n x blocks > pool", Req("x", Prompt(8), Greedy(20), 3), absl::StatusCode::kInvalidArgument,
                   "whole KV cache has 16"});
  cases.push_back({"empty id", Req("", Prompt(4), Greedy(4)), absl::StatusCode::kInvalidArgument, "request_id"});
  EngineRequest bad_eos = Req("x", Prompt(4), Greedy(4));
  bad_eos.eos_token_ids = {kVocab + 3};
  cases.push_back({"eos outside vocab", bad_eos, absl::StatusCode::kInvalidArgument, "eos token id"});
  EngineRequest long_salt = Req("x", Prompt(4), Greedy(4));
  long_salt.cache_salt.assign(kMaxCacheSaltBytes + 1, 's');
  cases.push_back(
      {"cache_salt too long", long_salt, absl::StatusCode::kInvalidArgument, "'cache_salt' must be at most"});
  cases.push_back({"duplicate id", Req("live", Prompt(4), Greedy(4)), absl::StatusCode::kAlreadyExists, "live"});
  for (Case& c : cases) {
    bool called = false;
    c.request.on_output = [&](const RequestOutput&) { called = true; };
    const absl::Status s = d.engine->AddRequest(c.request);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_NE(s.message().find(c.message), absl::string_view::npos) << c.name << ": " << s;
    const EngineStats after = d.engine->stats();
    EXPECT_EQ(after.num_unfinished_requests, before.num_unfinished_requests) << c.name;
    EXPECT_EQ(after.num_waiting_seqs, before.num_waiting_seqs) << c.name;
    EXPECT_EQ(after.num_kv_blocks_used, before.num_kv_blocks_used) << c.name;
    EXPECT_EQ(after.prefix_cache_queries, before.prefix_cache_queries) << c.name;
    EXPECT_FALSE(called);
  }
  // Exactly fits: 2 shared + 3 * 4 = 14 blocks.
  EXPECT_EQ(PeakKvBlocks(8, 16, 3, kBs), 14);
  EXPECT_TRUE(d.engine->AddRequest(Req("fits", Prompt(8), Greedy(16), 3)).ok());
  d.RunToCompletion();
  EXPECT_EQ(d.num_final["live"], 1);
  d.ExpectReference("live");
  d.ExpectKvEmpty();
}

TEST(EngineTest, RequestIdIsReusableAfterItFinishes) {
  Driver d(Options(64));
  ASSERT_TRUE(d.Add(Req("a", Prompt(4), Greedy(2))).ok());
  EXPECT_EQ(d.engine->AddRequest(Req("a", Prompt(4), Greedy(2))).code(), absl::StatusCode::kAlreadyExists);
  d.RunToCompletion();
  EXPECT_TRUE(d.engine->AddRequest(Req("a", Prompt(4), Greedy(2))).ok());
}

TEST(EngineTest, AbortInEveryStateFreesEverythingAndEmitsAFinalAbortOutput) {
  EngineOptions o = Options(12);
  o.scheduler.max_num_batched_tokens = 8;
  Driver d(o, 12);
  int32_t callback_finals = 0;
  auto add = [&](const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens, int32_t n) {
    EngineRequest r = Req(id, std::move(prompt), Greedy(max_tokens), n);
    r.on_output = [&, id](const RequestOutput& out) {
      if (out.finished) {
        ++callback_finals;
        for (const CompletionOutput& c : out.outputs) EXPECT_EQ(c.finish_reason, CompletionFinishReason::kAbort);
      }
    };
    ASSERT_TRUE(d.Add(r).ok());
  };
  add("decoding", Prompt(4), 30, 1);
  d.Step();
  add("forked", Prompt(3, 7), 10, 2);
  d.Step();
  d.Step();
  add("prefilling", Prompt(20, 3), 5, 1);
  d.Step();
  add("waiting", Prompt(6, 9), 5, 1);
  ASSERT_TRUE(d.engine->kv_cache().HasRequest(kv::RequestId{3}));  // "prefilling", mid-prompt
  auto abort = [&](const std::string& id, size_t n) {
    absl::StatusOr<RequestOutput> out = d.engine->Abort(id);
    ASSERT_TRUE(out.ok()) << id << ": " << out.status();
    d.Record(*out);
    EXPECT_TRUE(out->finished);
    EXPECT_EQ(out->outputs.size(), n) << id;
    for (const CompletionOutput& c : out->outputs) EXPECT_EQ(c.finish_reason, CompletionFinishReason::kAbort);
    EXPECT_TRUE(d.engine->scheduler().CheckInvariants().ok()) << d.engine->scheduler().CheckInvariants();
    EXPECT_EQ(d.engine->Abort(id).status().code(), absl::StatusCode::kFailedPrecondition);
  };
  abort("waiting", 1);
  abort("prefilling", 1);
  abort("forked", 2);
  add("other", Prompt(8, 11), 30, 1);
  while (d.engine->stats().num_preemptions == 0) d.Step();
  ASSERT_EQ(d.engine->stats().num_waiting_seqs, 1);  // preempted
  abort("other", 1);
  abort("decoding", 1);
  EXPECT_EQ(callback_finals, 5);
  EXPECT_FALSE(d.engine->HasUnfinishedRequests());
  d.ExpectKvEmpty();
  EXPECT_EQ(d.engine->stats().num_aborted_requests, 5);
  EXPECT_TRUE(d.engine->Step().value().empty());
}

TEST(EngineTest, PreemptionUnderATinyPoolLosesAndRepeatsNothing) {
  EngineOptions o = Options(/*num_blocks=*/10, /*max_model_len=*/40);
  o.scheduler.max_num_batched_tokens = 16;
  Driver d(o, 10);
  for (int32_t i = 0; i < 8; ++i) {
    SamplingParams p = i % 2 == 0 ? Greedy(20) : Seeded(20, 100 + i);
    p.ignore_eos = true;
    ASSERT_TRUE(d.Add(Req(absl::StrCat("r", i), Prompt(9 + i, 3 * i), p)).ok());
  }
  d.RunToCompletion();
  EXPECT_GT(d.engine->stats().num_preemptions, 0);
  for (const auto& [id, r] : d.requests) {
    EXPECT_EQ(d.num_final[id], 1);
    EXPECT_EQ(d.reasons[id][0], CompletionFinishReason::kLength);
    d.ExpectReference(id);
  }
  d.ExpectKvEmpty();
}

TEST(EngineTest, ParallelSamplingSharesThePromptAndYieldsNOutputs) {
  Driver d(Options(64));
  EngineRequest r = Req("n4", Prompt(13), Seeded(8, 7), 4);
  r.sampling_params.ignore_eos = true;
  ASSERT_TRUE(d.Add(r).ok());
  d.Step();  // the prompt, once
  EXPECT_EQ(d.engine->stats().num_prefill_tokens, 13);
  EXPECT_EQ(d.engine->stats().num_kv_blocks_used, 4);  // ceil(13 / 4), not 4 x 4
  EXPECT_EQ(d.engine->stats().num_running_seqs, 4);
  d.RunToCompletion();
  ASSERT_EQ(d.completions["n4"].size(), 4u);
  for (int32_t i = 0; i < 4; ++i) EXPECT_EQ(d.completions["n4"][i].size(), 8u);
  d.ExpectReference("n4");
  EXPECT_EQ(d.num_final["n4"], 1);
  // Sample 0 of an n = 4 request is the n = 1 request with the same seed.
  EXPECT_EQ(d.completions["n4"][0], Reference(Req("one", Prompt(13), r.sampling_params), 0));
  d.ExpectKvEmpty();
}

TEST(EngineTest, PrefixCacheHitsSkipComputeAndAreCounted) {
  Driver d(Options(64));
  ASSERT_TRUE(d.Add(Req("first", Prompt(17), Greedy(2))).ok());
  d.RunToCompletion();
  EXPECT_EQ(d.engine->stats().num_prefill_tokens, 17);
  ASSERT_TRUE(d.Add(Req("second", Prompt(17), Greedy(2))).ok());
  d.RunToCompletion();
  const EngineStats s = d.engine->stats();
  EXPECT_EQ(s.num_prefill_tokens, 17 + 1);  // 16 tokens (4 blocks) were cached
  EXPECT_EQ(s.prefix_cache_hit_tokens, 16);
  EXPECT_EQ(s.prefix_cache_hits, 1);
  EXPECT_EQ(s.prefix_cache_queries, 2);
  EXPECT_GT(s.num_kv_blocks_cached, 0);
  EXPECT_EQ(d.completions["first"][0], d.completions["second"][0]);
  d.ExpectReference("second");
}

TEST(EngineTest, CacheSaltSharesThePrefixCacheOnlyWithTheSameSalt) {
  Driver d(Options(64));
  // Runs one 17-token request (4 full blocks of 4) alone; returns its cached prompt tokens.
  auto run = [&](const std::string& id, std::string salt) {
    EngineRequest r = Req(id, Prompt(17), Greedy(2));
    r.cache_salt = std::move(salt);
    EXPECT_TRUE(d.Add(std::move(r)).ok());
    int32_t cached = -1;
    for (int32_t i = 0; i < 1000 && d.engine->HasUnfinishedRequests(); ++i) {
      for (const RequestOutput& o : d.Step()) {
        if (o.finished) cached = o.num_cached_prompt_tokens;
      }
    }
    return cached;
  };
  EXPECT_EQ(run("a1", "tenant-a"), 0);
  EXPECT_EQ(run("a2", "tenant-a"), 16);  // same salt: every full block but the last token's
  EXPECT_EQ(run("b1", "tenant-b"), 0);   // another salt: the same tokens are a miss
  EXPECT_EQ(run("none1", ""), 0);        // no salt: a miss too
  EXPECT_EQ(run("none2", ""), 16);       // ... and unsalted requests share as before
  EXPECT_EQ(run("b2", "tenant-b"), 16);
  for (const std::string id : {"a1", "a2", "b1", "b2", "none1", "none2"}) d.ExpectReference(id);
  d.ExpectKvEmpty();
}

TEST(EngineTest, RunnerErrorFailsTheBatchCleanly) {
  EngineOptions o = Options(64);
  o.scheduler.max_num_seqs = 2;
  Driver d(o);
  ASSERT_TRUE(d.Add(Req("a", Prompt(6), Greedy(5))).ok());
  ASSERT_TRUE(d.Add(Req("b", Prompt(6, 4), Greedy(5), 1)).ok());
  ASSERT_TRUE(d.Add(Req("c", Prompt(6, 8), Greedy(5))).ok());  // waits: max_num_seqs
  d.Step();
  d.runner.FailNext(absl::UnavailableError("device lost"));
  const std::vector<RequestOutput> outs = d.Step();
  ASSERT_EQ(outs.size(), 2u);
  for (const RequestOutput& out : outs) {
    EXPECT_TRUE(out.finished);
    EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(out.status.message().find("device lost"), absl::string_view::npos);
    EXPECT_EQ(out.outputs.at(0).finish_reason, CompletionFinishReason::kError);
  }
  EXPECT_EQ(d.engine->stats().num_runner_failures, 1);
  EXPECT_EQ(d.engine->stats().num_failed_requests, 2);
  EXPECT_EQ(d.engine->kv_cache().num_used_blocks(), 0);
  d.RunToCompletion();
  d.ExpectReference("c");  // untouched by the failure
  EXPECT_EQ(d.num_final["a"], 1);
  d.ExpectKvEmpty();
}

// A failed step with a runner that keeps tables: the failed requests' tables are released
// with the next batch, and the request that was waiting then runs on deltas to its
// reference tokens.
TEST(EngineTest, RunnerErrorWithKeptBlockTablesReleasesTheFailedSequences) {
  EngineOptions o = Options(64);
  o.scheduler.max_num_seqs = 2;
  Driver d(o, 64, /*keeps_block_tables=*/true);
  ASSERT_TRUE(d.Add(Req("a", Prompt(6), Greedy(5))).ok());
  ASSERT_TRUE(d.Add(Req("b", Prompt(6, 4), Greedy(5), 1)).ok());
  ASSERT_TRUE(d.Add(Req("c", Prompt(6, 8), Greedy(9))).ok());  // waits: max_num_seqs
  d.Step();
  d.runner.FailNext(absl::UnavailableError("device lost"));
  ASSERT_EQ(d.Step().size(), 2u);
  d.Step();
  const ModelBatch& next = d.runner.batches().back();
  std::vector<int64_t> released = next.released_seq_ids;
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<int64_t>{0, 1}));  // a and b
  ASSERT_EQ(next.chunks.size(), 1u);                   // c, whole
  EXPECT_EQ(next.chunks[0].block_table_start, 0);
  d.RunToCompletion();
  d.ExpectReference("c");
  EXPECT_GT(d.runner.batches().back().chunks.at(0).block_table_start, 0);  // c's later steps: deltas
  d.ExpectKvEmpty();
}

TEST(EngineTest, MalformedRunnerOutputIsAnInternalRunnerError) {
  Driver d(Options(64));
  ASSERT_TRUE(d.Add(Req("a", Prompt(6), Greedy(5))).ok());
  d.runner.TruncateLogitsNext();
  const std::vector<RequestOutput> outs = d.Step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].status.code(), absl::StatusCode::kInternal);
  d.ExpectKvEmpty();
  // A runner's InvalidArgument (a malformed batch) is the engine's bug, not the client's.
  ASSERT_TRUE(d.Add(Req("b", Prompt(6), Greedy(5))).ok());
  d.runner.FailNext(absl::InvalidArgumentError("block table too short"));
  EXPECT_EQ(d.Step().at(0).status.code(), absl::StatusCode::kInternal);
}

TEST(EngineTest, StatsReportQueuesAndLastBatch) {
  EngineOptions o = Options(64);
  o.scheduler.max_num_seqs = 2;
  Driver d(o);
  for (int32_t i = 0; i < 3; ++i) ASSERT_TRUE(d.Add(Req(absl::StrCat("r", i), Prompt(5, i), Greedy(3))).ok());
  EXPECT_EQ(d.engine->stats().num_waiting_seqs, 3);
  d.Step();
  EngineStats s = d.engine->stats();
  EXPECT_EQ(s.num_running_seqs, 2);
  EXPECT_EQ(s.num_waiting_seqs, 1);
  EXPECT_EQ(s.last_batch_num_seqs, 2);
  EXPECT_EQ(s.last_batch_num_tokens, 10);
  EXPECT_EQ(s.num_kv_blocks_used + s.num_kv_blocks_free + s.num_kv_blocks_cached, s.num_kv_blocks);
  EXPECT_EQ(s.num_steps, 1);
  d.RunToCompletion();
  EXPECT_EQ(d.engine->stats().num_decode_tokens, 3 * 2);  // 3 outputs, the last never computed
  EXPECT_FALSE(d.engine->DrainKvEvents().empty());
}

// Randomized soak: arrivals, lengths, shared prefixes, n, sampling, EOS and aborts under
// a small pool. After every step the KV and scheduler invariants hold; at the end every
// accepted request has ended exactly once, every one that was not aborted produced its
// reference tokens, and the pool holds nothing but cached blocks. With a runner that keeps
// block tables (the last parameter), the same holds with the tables sent as deltas.
class EngineSoakTest
    : public ::testing::TestWithParam<std::tuple<SchedulerOptions::Policy, bool, uint32_t, bool>> {};

TEST_P(EngineSoakTest, EveryRequestEndsExactlyOnceWithItsReferenceTokens) {
  const auto [policy, prefix_caching, seed, keeps_block_tables] = GetParam();
  EngineOptions o = Options(/*num_blocks=*/28, /*max_model_len=*/64);
  o.kv.enable_prefix_caching = prefix_caching;
  o.scheduler.max_num_batched_tokens = 24;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.long_prefill_token_threshold = 16;
  o.scheduler.policy = policy;
  Driver d(o, 28, keeps_block_tables);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> prefixes;
  for (int32_t i = 0; i < 4; ++i) prefixes.push_back(Prompt(uniform(0, 16), uniform(0, kVocab - 1)));
  std::map<std::string, int32_t> callback_finals;
  std::set<std::string> aborted;
  constexpr int32_t kRequests = 300;
  int32_t added = 0;
  int32_t rejected = 0;
  int32_t steps = 0;
  while (added < kRequests || d.engine->HasUnfinishedRequests()) {
    ASSERT_LT(++steps, 20000);
    for (int32_t k = uniform(0, 2); k > 0 && added < kRequests; --k) {
      const std::string id = absl::StrCat("q", added++);
      std::vector<int32_t> prompt = prefixes[uniform(0, 3)];
      for (int32_t t = uniform(1, 20); t > 0; --t) prompt.push_back(uniform(0, kVocab - 1));
      SamplingParams p;
      p.max_tokens = uniform(1, 20);
      if (uniform(0, 1) == 0) {
        p.temperature = 0.0f;
      } else {
        p.temperature = 0.7f;
        p.seed = rng();
        if (uniform(0, 2) == 0) p.top_k = 5;
      }
      if (uniform(0, 3) == 0) p.logprobs = 2;
      p.ignore_eos = uniform(0, 2) == 0;
      const int32_t n = std::vector<int32_t>{1, 1, 1, 2, 3}[uniform(0, 4)];
      EngineRequest r = Req(id, std::move(prompt), p, n);
      r.eos_token_ids = {0};
      r.priority = uniform(0, 3);
      r.on_output = [&callback_finals, id](const RequestOutput& out) {
        if (out.finished) ++callback_finals[id];
      };
      const absl::Status s = d.Add(r);
      if (!s.ok()) {
        // Only a request too big for the whole pool may be refused.
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find("whole KV cache"), absl::string_view::npos) << s;
        ++rejected;
      }
    }
    if (uniform(0, 19) == 0 && d.engine->HasUnfinishedRequests()) {
      // Abort a random unfinished request, whatever its state.
      std::vector<std::string> live;
      for (const auto& [id, r] : d.requests) {
        if (d.num_final[id] == 0) live.push_back(id);
      }
      ASSERT_FALSE(live.empty());
      const std::string victim = live[static_cast<size_t>(uniform(0, static_cast<int32_t>(live.size()) - 1))];
      absl::StatusOr<RequestOutput> out = d.engine->Abort(victim);
      ASSERT_TRUE(out.ok()) << out.status();
      d.Record(*out);
      aborted.insert(victim);
      ASSERT_TRUE(d.engine->scheduler().CheckInvariants().ok());
    }
    d.Step();  // checks the invariants
    const EngineStats s = d.engine->stats();
    EXPECT_LE(s.last_batch_num_tokens, 24);
    EXPECT_LE(s.last_batch_num_seqs, 8);
    (void)d.engine->DrainKvEvents();
  }
  EXPECT_LT(rejected, kRequests / 4);
  int32_t compared = 0;
  for (const auto& [id, r] : d.requests) {
    EXPECT_EQ(d.num_final[id], 1) << id;
    EXPECT_EQ(callback_finals[id], 1) << id;
    if (aborted.contains(id)) continue;
    ASSERT_EQ(d.completions[id].size(), static_cast<size_t>(r.n)) << id;
    for (int32_t i = 0; i < r.n; ++i) EXPECT_NE(d.reasons[id][i], CompletionFinishReason::kNone) << id;
    d.ExpectReference(id);
    ++compared;
  }
  EXPECT_GT(compared, kRequests / 2);
  d.ExpectKvEmpty();
  const EngineStats s = d.engine->stats();
  EXPECT_EQ(s.num_finished_requests, static_cast<int64_t>(d.requests.size()));
  EXPECT_EQ(s.num_aborted_requests, static_cast<int64_t>(aborted.size()));
  EXPECT_EQ(s.num_failed_requests, 0);
  EXPECT_GT(s.num_preemptions, 0);  // the pool is small enough to force some
  if (prefix_caching) {
    EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  }
  int64_t deltas = 0, releases = 0;
  for (const ModelBatch& b : d.runner.batches()) {
    for (const SequenceChunk& c : b.chunks) deltas += c.block_table_start > 0 ? 1 : 0;
    releases += static_cast<int64_t>(b.released_seq_ids.size());
  }
  if (keeps_block_tables) {
    EXPECT_GT(deltas, 1000);
    EXPECT_GT(releases, 300);
  } else {
    EXPECT_EQ(deltas + releases, 0);  // whole tables for a runner that keeps none
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, EngineSoakTest,
                         ::testing::Values(std::tuple(SchedulerOptions::Policy::kFcfs, true, 1u, false),
                                           std::tuple(SchedulerOptions::Policy::kFcfs, false, 2u, false),
                                           std::tuple(SchedulerOptions::Policy::kPriority, true, 3u, false),
                                           std::tuple(SchedulerOptions::Policy::kPriority, false, 4u, false),
                                           std::tuple(SchedulerOptions::Policy::kFcfs, true, 5u, true),
                                           std::tuple(SchedulerOptions::Policy::kPriority, false, 6u, true)));

}  // namespace
}  // namespace kvmesh::engine
