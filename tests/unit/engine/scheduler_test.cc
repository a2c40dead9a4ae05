#include "engine/scheduler.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "engine/block_tables.h"
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

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, SamplingParams params, int32_t n = 1,
                  int32_t priority = 0) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params = params;
  r.n = n;
  r.priority = priority;
  return r;
}

// Scheduler + KV manager + fake runner, stepped by hand.
struct Harness {
  explicit Harness(const SchedulerOptions& options, int32_t num_blocks = 64, bool prefix_caching = true)
      : runner(kVocab, kBs, num_blocks) {
    kv = kv::KvCacheManager::Create(
             {.num_blocks = num_blocks, .block_size_tokens = kBs, .enable_prefix_caching = prefix_caching})
             .value();
    scheduler = Scheduler::Create(options, *kv, kVocab).value();
  }

  void Add(const EngineRequest& r) {
    ASSERT_TRUE(scheduler->AddRequest(r).ok());
    requests[r.request_id] = r;
  }

  // One engine step; collects outputs into `completions` (per request, per sample).
  SchedulerOutput Step() {
    SchedulerOutput out = scheduler->Schedule().value();
    if (out.empty()) return out;
    if (on_scheduled) on_scheduled(out);
    ModelOutput result = runner.Execute(out.batch).value();
    std::vector<RequestOutput> outputs = scheduler->UpdateFromOutput(out, result.logits).value();
    for (const RequestOutput& o : outputs) {
      EXPECT_FALSE(finished.contains(o.request_id)) << o.request_id << " got an output after finishing";
      for (const CompletionOutput& c : o.outputs) {
        std::vector<int32_t>& tokens = completions[o.request_id][c.index];
        tokens.insert(tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      }
      if (o.finished) finished[o.request_id] = o;
    }
    EXPECT_TRUE(scheduler->CheckInvariants().ok()) << scheduler->CheckInvariants();
    return out;
  }

  void RunToCompletion(int32_t max_steps = 10000) {
    for (int32_t i = 0; i < max_steps && scheduler->HasUnfinishedRequests(); ++i) Step();
    ASSERT_FALSE(scheduler->HasUnfinishedRequests());
  }

  // Every request produced exactly its reference tokens.
  void ExpectReferenceOutputs() {
    for (const auto& [id, r] : requests) {
      ASSERT_TRUE(finished.contains(id)) << id;
      for (int32_t i = 0; i < r.n; ++i) {
        SamplingParams p = r.sampling_params;
        if (p.seed.has_value()) p.seed = *p.seed + static_cast<uint64_t>(i);
        EXPECT_EQ(completions[id][i], ReferenceCompletion(r.prompt_token_ids, p, r.eos_token_ids, kVocab))
            << id << " sample " << i;
      }
    }
  }

  // Called with each batch before the runner sees it (the KV tables are as it was built).
  std::function<void(const SchedulerOutput&)> on_scheduled;
  FakeModelRunner runner;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<Scheduler> scheduler;
  std::map<std::string, EngineRequest> requests;
  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> completions;
  std::map<std::string, RequestOutput> finished;
};

TEST(SchedulerOptionsTest, ValidateRejectsNonPositiveLimits) {
  EXPECT_EQ(SchedulerOptions{.max_num_batched_tokens = 0}.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SchedulerOptions{.max_num_seqs = 0}.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SchedulerOptions{.long_prefill_token_threshold = -1}.Validate().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SchedulerOptions{}.Validate().ok());
}

TEST(SchedulerTest, TokenBudgetIsRespectedEveryStep) {
  Harness h({.max_num_batched_tokens = 16, .max_num_seqs = 8}, /*num_blocks=*/256);
  std::mt19937 rng(7);
  for (int32_t i = 0; i < 12; ++i) {
    h.Add(Req(absl::StrCat("r", i), Prompt(5 + static_cast<int32_t>(rng() % 36), i), Greedy(8)));
  }
  int32_t steps = 0;
  while (h.scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput out = h.Step();
    int32_t tokens = 0;
    for (const SequenceChunk& c : out.batch.chunks) tokens += static_cast<int32_t>(c.token_ids.size());
    EXPECT_EQ(tokens, out.num_batched_tokens);
    EXPECT_LE(tokens, 16);
    EXPECT_LE(out.batch.chunks.size(), 8u);
    ASSERT_LT(++steps, 1000);
  }
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, ChunkedPrefillSplitsALongPromptAndMixesItWithDecodes) {
  Harness h({.max_num_batched_tokens = 16});
  h.Add(Req("a", Prompt(4), Greedy(20)));
  SchedulerOutput s1 = h.Step();  // a's prompt
  ASSERT_EQ(s1.chunks.size(), 1u);
  EXPECT_EQ(s1.chunks[0].num_tokens, 4);
  EXPECT_TRUE(s1.chunks[0].compute_logits);
  h.Add(Req("b", Prompt(40, 5), Greedy(4)));
  // Decode of a (1 token) first, then 15 tokens of b's prompt, 15 more, then the last 10.
  const int32_t expected_b[][3] = {{0, 15, 0}, {15, 15, 0}, {30, 10, 1}};
  for (const auto& e : expected_b) {
    const SchedulerOutput s = h.Step();
    ASSERT_EQ(s.chunks.size(), 2u);
    EXPECT_EQ(s.chunks[0].num_tokens, 1);  // a decodes
    EXPECT_TRUE(s.chunks[0].compute_logits);
    EXPECT_EQ(s.chunks[1].start_position, e[0]);
    EXPECT_EQ(s.chunks[1].num_tokens, e[1]);
    EXPECT_EQ(s.chunks[1].compute_logits, e[2] == 1);
    EXPECT_EQ(s.batch.chunks[1].start_position, e[0]);
    EXPECT_EQ(s.batch.chunks[1].compute_logits, e[2] == 1);
  }
  EXPECT_EQ(h.completions["b"][0].size(), 1u);  // sampled once, after the last chunk
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, WithoutChunkedPrefillAPromptWaitsForAWholeBudget) {
  Harness h({.max_num_batched_tokens = 64, .enable_chunked_prefill = false}, /*num_blocks=*/128);
  h.Add(Req("a", Prompt(4), Greedy(3)));
  h.Step();                           // a's prompt
  h.Add(Req("b", Prompt(64, 3), Greedy(2)));
  SchedulerOutput s = h.Step();       // a decodes; b (64) does not fit in the 63 left
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].num_tokens, 1);
  h.Step();                           // a's last token
  s = h.Step();
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].num_tokens, 64);  // b in one piece
  EXPECT_TRUE(s.chunks[0].compute_logits);
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, LongPrefillTokenThresholdCapsEachChunk) {
  Harness h({.max_num_batched_tokens = 64, .long_prefill_token_threshold = 8});
  h.Add(Req("a", Prompt(20), Greedy(2)));
  for (const int32_t expected : {8, 8, 4}) {
    const SchedulerOutput s = h.Step();
    ASSERT_EQ(s.chunks.size(), 1u);
    EXPECT_EQ(s.chunks[0].num_tokens, expected);
  }
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, MaxNumSeqsIsRespected) {
  Harness h({.max_num_seqs = 3}, /*num_blocks=*/128);
  for (int32_t i = 0; i < 8; ++i) h.Add(Req(absl::StrCat("r", i), Prompt(6, i), Greedy(5)));
  while (h.scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput s = h.Step();
    EXPECT_LE(s.chunks.size(), 3u);
    EXPECT_LE(h.scheduler->stats().num_running_seqs, 3);
  }
  h.ExpectReferenceOutputs();
}

// The order in which requests are first scheduled, one at a time.
std::vector<std::string> AdmissionOrder(SchedulerOptions::Policy policy) {
  Harness h({.max_num_seqs = 1, .policy = policy});
  h.Add(Req("p5", Prompt(4), Greedy(2), 1, /*priority=*/5));
  h.Add(Req("p1a", Prompt(4, 2), Greedy(2), 1, 1));
  h.Add(Req("p3", Prompt(4, 3), Greedy(2), 1, 3));
  h.Add(Req("p1b", Prompt(4, 4), Greedy(2), 1, 1));
  std::vector<std::string> order;
  std::map<int64_t, std::string> by_kv_id = {{0, "p5"}, {1, "p1a"}, {2, "p3"}, {3, "p1b"}};
  while (h.scheduler->HasUnfinishedRequests()) {
    for (const ScheduledChunk& c : h.Step().chunks) {
      const std::string& id = by_kv_id[c.kv_id.value];
      if (std::find(order.begin(), order.end(), id) == order.end()) order.push_back(id);
    }
  }
  h.ExpectReferenceOutputs();
  return order;
}

TEST(SchedulerTest, FcfsAdmitsInArrivalOrder) {
  EXPECT_EQ(AdmissionOrder(SchedulerOptions::Policy::kFcfs), (std::vector<std::string>{"p5", "p1a", "p3", "p1b"}));
}

TEST(SchedulerTest, PriorityPolicyAdmitsLowestPriorityValueFirstThenArrival) {
  EXPECT_EQ(AdmissionOrder(SchedulerOptions::Policy::kPriority),
            (std::vector<std::string>{"p1a", "p1b", "p3", "p5"}));
}

TEST(SchedulerTest, PrefixCacheHitSkipsCachedTokens) {
  Harness h({});
  h.Add(Req("a", Prompt(20), Greedy(3)));
  h.RunToCompletion();
  const int64_t prefill_before = h.scheduler->stats().num_prefill_tokens;
  EXPECT_EQ(prefill_before, 20);
  std::vector<int32_t> longer = Prompt(20);
  for (int32_t t : {9, 8, 7, 6, 5}) longer.push_back(t);
  h.Add(Req("b", longer, Greedy(3)));
  const SchedulerOutput s = h.Step();
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].start_position, 20);  // a's 5 prompt blocks came from the cache
  EXPECT_EQ(s.chunks[0].num_tokens, 5);
  EXPECT_EQ(h.scheduler->stats().num_prefill_tokens - prefill_before, 5);
  EXPECT_EQ(h.kv->prefix_cache_stats().prefix_cache_hit_tokens, 20);
  h.RunToCompletion();
  EXPECT_EQ(h.finished["b"].num_cached_prompt_tokens, 20);
  EXPECT_EQ(h.finished["a"].num_cached_prompt_tokens, 0);
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, RequestsArrivingTogetherShareAPrefixBeingComputed) {
  // b and c share a's 16-token prefix and arrive in the same step. Instead of three
  // copies of the prefix in one batch, b and c wait one step and hit the cache.
  Harness h({});
  std::vector<int32_t> b = Prompt(16), c = Prompt(16);
  for (int32_t t : {9, 8, 7}) b.push_back(t);
  for (int32_t t : {5, 6}) c.push_back(t);
  h.Add(Req("a", Prompt(18), Greedy(3)));
  h.Add(Req("b", b, Greedy(3)));
  h.Add(Req("c", c, Greedy(3)));
  const SchedulerOutput first = h.Step();
  ASSERT_EQ(first.chunks.size(), 1u);  // only a: b and c are deferred
  EXPECT_EQ(h.scheduler->stats().num_deferred_for_prefix, 2);
  const SchedulerOutput second = h.Step();
  ASSERT_EQ(second.chunks.size(), 3u);  // a's decode, then b and c from position 16
  EXPECT_EQ(second.chunks[1].start_position, 16);
  EXPECT_EQ(second.chunks[2].start_position, 16);
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler->stats().num_prefill_tokens, 18 + 3 + 2);
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, NoDeferralWithoutPrefixCaching) {
  Harness h({}, 64, /*prefix_caching=*/false);
  h.Add(Req("a", Prompt(18), Greedy(2)));
  h.Add(Req("b", Prompt(17), Greedy(2)));
  EXPECT_EQ(h.Step().chunks.size(), 2u);
  EXPECT_EQ(h.scheduler->stats().num_deferred_for_prefix, 0);
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, FcfsPreemptsTheLastAdmittedAndItRecomputesTheSameTokens) {
  // 6 blocks of 4: a and b (8-token prompts) each grow to 3 blocks; at position 12 a
  // needs a fourth and the pool is empty, so b (admitted last) is preempted.
  Harness h({}, /*num_blocks=*/6);
  h.Add(Req("a", Prompt(8), Greedy(14)));
  h.Add(Req("b", Prompt(8, 9), Greedy(14)));
  bool saw_preemption = false;
  while (h.scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput s = h.Step();
    if (s.num_preempted > 0 && !saw_preemption) {
      saw_preemption = true;
      ASSERT_EQ(s.chunks.size(), 1u);
      EXPECT_EQ(s.chunks[0].kv_id.value, 0);  // a runs on, b (kv id 1) was preempted
      EXPECT_EQ(h.scheduler->stats().num_waiting_seqs, 1);
      EXPECT_FALSE(h.kv->HasRequest(kv::RequestId{1}));
    }
  }
  EXPECT_TRUE(saw_preemption);
  EXPECT_GE(h.scheduler->stats().num_preemptions, 1);
  EXPECT_EQ(h.kv->num_used_blocks(), 0);
  h.ExpectReferenceOutputs();  // nothing lost or repeated across the preemption
}

TEST(SchedulerTest, PriorityPolicyPreemptsTheLowestPriorityEvenIfAdmittedFirst) {
  Harness h({.policy = SchedulerOptions::Policy::kPriority}, /*num_blocks=*/6);
  h.Add(Req("low", Prompt(8), Greedy(14), 1, /*priority=*/5));
  h.Step();  // low is admitted alone
  h.Add(Req("high", Prompt(8, 9), Greedy(14), 1, /*priority=*/0));
  bool saw_preemption = false;
  while (h.scheduler->HasUnfinishedRequests()) {
    const SchedulerOutput s = h.Step();
    if (s.num_preempted > 0 && !saw_preemption) {
      saw_preemption = true;
      EXPECT_FALSE(h.kv->HasRequest(kv::RequestId{0}));  // low
      EXPECT_TRUE(h.kv->HasRequest(kv::RequestId{1}));   // high
    }
  }
  EXPECT_TRUE(saw_preemption);
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, ParallelSamplingForksAndSharesThePromptBlocks) {
  Harness h({}, /*num_blocks=*/32);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  p.ignore_eos = true;
  p.max_tokens = 6;
  h.Add(Req("r", Prompt(10), p, /*n=*/3));
  const SchedulerOutput s1 = h.Step();
  ASSERT_EQ(s1.chunks.size(), 1u);  // the prompt runs once
  EXPECT_EQ(h.kv->num_used_blocks(), 3);  // ceil(10 / 4), shared by the 3 samples
  EXPECT_EQ(h.scheduler->stats().num_running_seqs, 3);
  EXPECT_EQ(h.completions["r"].size(), 3u);
  const SchedulerOutput s2 = h.Step();
  EXPECT_EQ(s2.chunks.size(), 3u);
  // The shared partial block is copied for two samples; the last writer owns it alone.
  EXPECT_EQ(s2.batch.block_copies.size(), 2u);
  EXPECT_EQ(h.kv->num_used_blocks(), 2 + 3);
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
  // Seeds differ per sample, so the samples (almost surely) differ.
  EXPECT_NE(h.completions["r"][0], h.completions["r"][1]);
  EXPECT_EQ(h.kv->num_used_blocks(), 0);
}

// With a runner that keeps block tables, chunks carry deltas: under churn (a pool small
// enough to preempt, shared prefixes hitting the prefix cache, forks whose shared last
// block is copied on write, aborts) a runner's kept tables, updated from every batch
// alone, equal the KV manager's tables for every chunk of every step, decode chunks carry
// one entry, and every sample still produces its reference tokens (the fake runner reads
// KV through its own kept tables).
TEST(SchedulerTest, BlockTableDeltasKeepTheRunnersTablesEqualToTheKvManagersUnderChurn) {
  Harness h({.max_num_batched_tokens = 48, .max_num_seqs = 10, .runner_keeps_block_tables = true},
            /*num_blocks=*/40);
  h.runner.set_keeps_block_tables(true);
  BlockTables kept({.num_pool_blocks = 40});
  int64_t deltas = 0, decode_chunks = 0, released = 0, copies = 0;
  h.on_scheduled = [&](const SchedulerOutput& out) {
    ASSERT_TRUE(kept.Apply(out.batch, nullptr).ok());
    released += static_cast<int64_t>(out.batch.released_seq_ids.size());
    copies += static_cast<int64_t>(out.batch.block_copies.size());
    for (size_t i = 0; i < out.chunks.size(); ++i) {
      const SequenceChunk& c = out.batch.chunks[i];
      ASSERT_EQ(c.seq_id, out.chunks[i].kv_id.value);
      std::vector<int32_t> truth;
      for (const kv::BlockId b : h.kv->block_table(out.chunks[i].kv_id)) truth.push_back(b.value);
      const std::span<const int32_t> row = kept.row(kept.chunk_row(i));
      ASSERT_EQ(std::vector<int32_t>(row.begin(), row.end()), truth) << "sequence " << c.seq_id;
      deltas += c.block_table_start > 0 ? 1 : 0;
      // A decode chunk of a sequence the runner has (not a fork's or a resumed one's first).
      if (c.token_ids.size() == 1 && c.block_table_start > 0) {
        ++decode_chunks;
        EXPECT_EQ(c.block_table.size(), 1u) << "a decode chunk carries the block it writes into";
      }
    }
  };
  std::mt19937 rng(1612);
  int32_t added = 0;
  for (int32_t step = 0; step < 4000 && (added < 120 || h.scheduler->HasUnfinishedRequests()); ++step) {
    if (added < 120 && rng() % 3 == 0) {
      // Prompts of one of three families share their first 8-24 tokens.
      const int32_t family = static_cast<int32_t>(rng() % 3);
      std::vector<int32_t> prompt = Prompt(8 + 8 * family, 100 * family);
      const std::vector<int32_t> tail = Prompt(1 + static_cast<int32_t>(rng() % 20), added);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      SamplingParams p = Greedy(1 + static_cast<int32_t>(rng() % 30));
      const int32_t n = rng() % 4 == 0 ? 2 + static_cast<int32_t>(rng() % 2) : 1;
      if (n > 1) {
        p.temperature = 1.0f;
        p.seed = added;
      }
      h.Add(Req(absl::StrCat("r", added++), prompt, p, n));
    }
    if (rng() % 40 == 0) {  // abort one unfinished request
      for (const auto& [id, r] : h.requests) {
        if (h.finished.contains(id)) continue;
        const std::string victim = id;
        ASSERT_TRUE(h.scheduler->Abort(victim).ok());
        h.requests.erase(victim);  // its tokens are cut short: no reference to compare
        break;
      }
    }
    h.Step();
  }
  ASSERT_FALSE(h.scheduler->HasUnfinishedRequests());
  h.ExpectReferenceOutputs();
  EXPECT_GT(h.scheduler->stats().num_preemptions, 10);
  EXPECT_GT(copies, 10);
  EXPECT_GT(deltas, 1000);
  EXPECT_GT(decode_chunks, 1000);
  EXPECT_GT(released, 100);
  EXPECT_GT(h.kv->prefix_cache_stats().hits, 10);
}

TEST(SchedulerTest, ParallelSamplesCountAgainstMaxNumSeqsBeforeTheFork) {
  Harness h({.max_num_seqs = 3}, /*num_blocks=*/64);
  h.Add(Req("n3", Prompt(6), Greedy(4), /*n=*/3));
  h.Add(Req("other", Prompt(6, 7), Greedy(4)));
  const SchedulerOutput s = h.Step();
  ASSERT_EQ(s.chunks.size(), 1u);  // n3 reserves all three slots
  h.RunToCompletion();
  h.ExpectReferenceOutputs();
}

TEST(SchedulerTest, AbortInEveryStateFreesAllBlocks) {
  Harness h({.max_num_batched_tokens = 8, .max_num_seqs = 4}, /*num_blocks=*/12);
  h.Add(Req("decoding", Prompt(4), Greedy(30)));
  h.Step();
  h.Add(Req("prefilling", Prompt(20, 3), Greedy(5)));
  h.Add(Req("forked", Prompt(3, 5), Greedy(5), /*n=*/2));
  h.Step();
  h.Add(Req("waiting", Prompt(6, 7), Greedy(5)));
  ASSERT_TRUE(h.kv->HasRequest(kv::RequestId{1}));  // prefilling is mid-prompt
  EXPECT_LT(h.kv->num_computed_tokens(kv::RequestId{1}), 20);

  auto expect_abort = [&](const std::string& id, int32_t n) {
    absl::StatusOr<RequestOutput> out = h.scheduler->Abort(id);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(out->finished);
    ASSERT_EQ(out->outputs.size(), static_cast<size_t>(n)) << id;
    for (int32_t i = 0; i < n; ++i) {
      EXPECT_EQ(out->outputs[i].index, i);
      EXPECT_EQ(out->outputs[i].finish_reason, CompletionFinishReason::kAbort);
    }
    EXPECT_TRUE(h.scheduler->CheckInvariants().ok()) << h.scheduler->CheckInvariants();
    EXPECT_EQ(h.scheduler->Abort(id).status().code(), absl::StatusCode::kFailedPrecondition);
  };
  expect_abort("waiting", 1);
  expect_abort("prefilling", 1);
  expect_abort("forked", 2);  // aborted before its prompt ran: all n samples end

  // A preempted request: fill the pool with a second decoder until one is preempted.
  h.Add(Req("other", Prompt(8, 11), Greedy(30)));
  while (h.scheduler->stats().num_preemptions == 0) h.Step();
  ASSERT_EQ(h.scheduler->stats().num_waiting_seqs, 1);
  expect_abort("other", 1);
  expect_abort("decoding", 1);
  EXPECT_FALSE(h.scheduler->HasUnfinishedRequests());
  EXPECT_EQ(h.kv->num_used_blocks(), 0);
  EXPECT_EQ(h.kv->num_requests(), 0);
  EXPECT_EQ(h.scheduler->stats().num_aborted_requests, 5);
}

TEST(SchedulerTest, AbortAfterTheForkEndsEverySample) {
  Harness h({}, /*num_blocks=*/32);
  h.Add(Req("r", Prompt(6), Greedy(10), /*n=*/3));
  h.Step();
  h.Step();
  absl::StatusOr<RequestOutput> out = h.scheduler->Abort("r");
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->outputs.size(), 3u);
  for (const CompletionOutput& c : out->outputs) {
    EXPECT_EQ(c.finish_reason, CompletionFinishReason::kAbort);
    EXPECT_TRUE(c.new_token_ids.empty());
    EXPECT_EQ(h.completions["r"][c.index].size(), 2u);  // what the two steps streamed
  }
  EXPECT_EQ(h.kv->num_used_blocks(), 0);
  EXPECT_TRUE(h.scheduler->CheckInvariants().ok());
}

TEST(SchedulerTest, DuplicateRequestIdIsAlreadyExists) {
  Harness h({});
  h.Add(Req("a", Prompt(4), Greedy(2)));
  EXPECT_EQ(h.scheduler->AddRequest(Req("a", Prompt(4), Greedy(2))).code(), absl::StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, FailScheduledEndsTheBatchsRequestsAndFreesTheirBlocks) {
  Harness h({.max_num_seqs = 2}, /*num_blocks=*/32);
  h.Add(Req("a", Prompt(5), Greedy(4)));
  h.Add(Req("b", Prompt(5, 3), Greedy(4)));
  h.Add(Req("c", Prompt(5, 6), Greedy(4)));
  h.Step();
  const SchedulerOutput s = h.scheduler->Schedule().value();
  const std::vector<RequestOutput> outs = h.scheduler->FailScheduled(s, absl::UnavailableError("device lost"));
  ASSERT_EQ(outs.size(), 2u);
  for (const RequestOutput& o : outs) {
    EXPECT_TRUE(o.finished);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable);
    ASSERT_EQ(o.outputs.size(), 1u);
    EXPECT_EQ(o.outputs[0].finish_reason, CompletionFinishReason::kError);
  }
  EXPECT_EQ(h.kv->num_used_blocks(), 0);
  EXPECT_TRUE(h.scheduler->CheckInvariants().ok());
  h.requests.erase("a");
  h.requests.erase("b");
  h.RunToCompletion();
  h.ExpectReferenceOutputs();  // c was waiting and is unaffected
}

TEST(SchedulerTest, UpdateFromOutputRejectsWrongLogitsSize) {
  Harness h({});
  h.Add(Req("a", Prompt(5), Greedy(4)));
  const SchedulerOutput s = h.scheduler->Schedule().value();
  std::vector<float> logits(kVocab - 1);
  EXPECT_EQ(h.scheduler->UpdateFromOutput(s, logits).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::engine
