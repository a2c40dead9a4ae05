#include "engine/async_engine.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fake_kv_storage_runner.h"
#include "fake_model_runner.h"

namespace kvmesh::engine {
namespace {

using testing::FakeKvStorageRunner;
using testing::FakeModelRunner;
using testing::ReferenceCompletion;

constexpr int32_t kBs = 4;
constexpr int32_t kVocab = 32;

EngineOptions Options() {
  EngineOptions o;
  o.kv.num_blocks = 64;
  o.kv.block_size_tokens = kBs;
  o.kv.record_events = false;
  o.max_model_len = 128;
  return o;
}

std::vector<int32_t> Prompt(int32_t n, int32_t start) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = (start + i) % kVocab;
  return v;
}

// Collects each request's streamed tokens and its single final output.
struct Collector {
  std::mutex mu;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> finals;
  std::atomic<int> num_finals{0};

  std::function<void(const RequestOutput&)> For() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& c : out.outputs) {
        auto& t = tokens[out.request_id];
        t.insert(t.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      }
      if (out.finished) {
        EXPECT_FALSE(finals.contains(out.request_id)) << out.request_id << " finished twice";
        finals[out.request_id] = out;
        ++num_finals;
      }
    };
  }
};

// A runner that takes 2 ms a step, so that a request is still running when a test aborts it.
class SlowRunner : public ModelRunner {
 public:
  explicit SlowRunner(ModelRunner& inner) : inner_(inner) {}
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t block_size_tokens() const override { return inner_.block_size_tokens(); }
  int32_t num_blocks() const override { return inner_.num_blocks(); }
  absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return inner_.Execute(batch);
  }

 private:
  ModelRunner& inner_;
};

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens, Collector& c) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params.temperature = 0;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.max_tokens = max_tokens;
  r.on_output = c.For();
  return r;
}

void WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(AsyncEngineTest, RequestsSubmittedFromManyThreadsAllFinishWithTheirTokens) {
  FakeModelRunner runner(kVocab, kBs, 64);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        const std::string id = std::to_string(t) + "-" + std::to_string(i);
        ASSERT_TRUE(engine.Submit(Req(id, Prompt(3 + i, t + i), 5 + i, c)).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  WaitFor([&] { return c.num_finals.load() == 32; });
  ASSERT_EQ(c.num_finals.load(), 32);
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 8; ++i) {
      const std::string id = std::to_string(t) + "-" + std::to_string(i);
      SamplingParams p;
      p.temperature = 0;
      p.ignore_eos = true;
      p.max_tokens = 5 + i;
      EXPECT_EQ(c.tokens[id], ReferenceCompletion(Prompt(3 + i, t + i), p, {}, kVocab)) << id;
      EXPECT_TRUE(c.finals[id].status.ok());
    }
  }
  EXPECT_EQ(engine.stats().num_kv_blocks_used, 0);
}

TEST(AsyncEngineTest, InvalidRequestsAreRejectedOnTheCallingThread) {
  FakeModelRunner runner(kVocab, kBs, 64);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  EXPECT_EQ(engine.Submit(Req("empty", {}, 4, c)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Submit(Req("long", Prompt(200, 1), 4, c)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Submit(Req("vocab", {kVocab}, 4, c)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.num_finals.load(), 0);
}

TEST(AsyncEngineTest, AbortFromAnotherThreadEndsTheRequestAndFreesItsBlocks) {
  FakeModelRunner fake(kVocab, kBs, 64);
  SlowRunner runner(fake);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  ASSERT_TRUE(engine.Submit(Req("long", Prompt(8, 1), 120, c)).ok());
  WaitFor([&] {
    std::lock_guard<std::mutex> lock(c.mu);
    return c.tokens["long"].size() >= 2;
  });
  engine.Abort("long");
  engine.Abort("no-such-request");  // ignored
  WaitFor([&] { return c.num_finals.load() == 1; });
  ASSERT_EQ(c.num_finals.load(), 1);
  EXPECT_EQ(c.finals["long"].outputs.at(0).finish_reason, CompletionFinishReason::kAbort);
  WaitFor([&] { return engine.stats().num_kv_blocks_used == 0; });
  EXPECT_EQ(engine.stats().num_kv_blocks_used, 0);
}

TEST(AsyncEngineTest, DuplicateIdGetsAFinalErrorOutputAndTheFirstKeepsRunning) {
  // Slow steps: the first request (60 tokens, ~120 ms) is still running when the
  // duplicate arrives, even on a loaded machine.
  FakeModelRunner fake(kVocab, kBs, 64);
  SlowRunner runner(fake);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector first, second;
  ASSERT_TRUE(engine.Submit(Req("same", Prompt(4, 1), 60, first)).ok());
  ASSERT_TRUE(engine.Submit(Req("same", Prompt(4, 2), 3, second)).ok());
  WaitFor([&] { return second.num_finals.load() == 1 && first.num_finals.load() == 1; });
  EXPECT_EQ(second.finals["same"].status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(first.finals["same"].status.ok());
  EXPECT_EQ(first.tokens["same"].size(), 60u);
}

TEST(AsyncEngineTest, DrainFinishesRunningRequestsAndRefusesNewOnes) {
  FakeModelRunner runner(kVocab, kBs, 64);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  ASSERT_TRUE(engine.Submit(Req("a", Prompt(4, 1), 20, c)).ok());
  engine.Drain(/*deadline_ms=*/10000);
  EXPECT_EQ(c.num_finals.load(), 1);
  EXPECT_EQ(c.tokens["a"].size(), 20u);  // finished, not aborted
  EXPECT_EQ(engine.Submit(Req("b", Prompt(4, 1), 2, c)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AsyncEngineTest, DrainDeadlineAbortsWhatIsLeft) {
  FakeModelRunner fake(kVocab, kBs, 64);
  SlowRunner runner(fake);
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  ASSERT_TRUE(engine.Submit(Req("a", Prompt(4, 1), 120, c)).ok());
  engine.Drain(/*deadline_ms=*/0);
  ASSERT_EQ(c.num_finals.load(), 1);
  EXPECT_EQ(c.finals["a"].outputs.at(0).finish_reason, CompletionFinishReason::kAbort);
}

// The worker's disaggregation path: a lease granted through SubmitWith on D, a
// prefill-only request on P, the blocks exported and imported by posted tasks, the
// commit posted to D. Same tokens as one engine; every block back on both sides.
TEST(AsyncEngineTest, HandoffThroughSubmitWithAndPostedTasks) {
  const std::vector<int32_t> prompt = Prompt(10, 1);
  FakeKvStorageRunner ref_runner(kVocab, kBs, 64);
  Collector ref;
  {
    AsyncEngine agg(Engine::Create(Options(), ref_runner).value());
    ASSERT_TRUE(agg.Submit(Req("r", prompt, 5, ref)).ok());
    agg.Drain(/*deadline_ms=*/20000);
  }
  FakeKvStorageRunner p_runner(kVocab, kBs, 64), d_runner(kVocab, kBs, 64);
  AsyncEngine p(Engine::Create(Options(), p_runner).value());
  AsyncEngine d(Engine::Create(Options(), d_runner).value());
  Collector pc, dc;
  std::promise<RemotePrefillLease> leased;
  ASSERT_TRUE(d.SubmitWith(Req("r", prompt, 5, dc), [&](Engine& e, EngineRequest r) -> absl::Status {
                 absl::StatusOr<RemotePrefillLease> lease = e.ReserveForRemotePrefill(std::move(r));
                 if (!lease.ok()) return lease.status();
                 leased.set_value(*lease);
                 return absl::OkStatus();
               }).ok());
  const RemotePrefillLease lease = leased.get_future().get();
  std::promise<PrefillResult> prefilled;
  EngineRequest pr = Req("r", prompt, 5, pc);
  pr.on_output = [&, inner = pr.on_output](const RequestOutput& o) {
    inner(o);
    if (o.prefill_result) prefilled.set_value(*o.prefill_result);
  };
  const int32_t skip = lease.num_cached_tokens;
  ASSERT_TRUE(p.SubmitWith(std::move(pr), [skip](Engine& e, EngineRequest r) {
                 return e.AddPrefillOnlyRequest(std::move(r), skip);
               }).ok());
  const PrefillResult result = prefilled.get_future().get();
  // Export on P's thread, then release; import and commit on D's.
  std::promise<std::vector<std::vector<std::byte>>> exported;
  p.Post([&](Engine& e) {
    std::vector<std::vector<std::byte>> blocks;
    for (int32_t layer = 0; layer < lease.kv_spec.num_layers; ++layer) {
      for (int32_t b = result.num_skipped_blocks; b < lease.num_blocks(); ++b) {
        const std::span<const std::byte> bytes = e.ExportKvBlock("r", 0, layer, b).value();
        blocks.emplace_back(bytes.begin(), bytes.end());
      }
    }
    EXPECT_TRUE(e.ReleasePrefill("r").ok());
    exported.set_value(std::move(blocks));
  });
  const std::vector<std::vector<std::byte>> blocks = exported.get_future().get();
  d.Post([&](Engine& e) {
    size_t i = 0;
    for (int32_t layer = 0; layer < lease.kv_spec.num_layers; ++layer) {
      for (int32_t b = result.num_skipped_blocks; b < lease.num_blocks(); ++b) {
        EXPECT_TRUE(e.ImportKvBlock(lease.transfer_id, 0, layer, b, blocks[i++]).ok());
      }
    }
    EXPECT_TRUE(e.CommitRemotePrefill(lease.transfer_id, result.first_token_id, result.first_token_logprobs).ok());
  });
  d.Drain(/*deadline_ms=*/20000);
  p.Drain(/*deadline_ms=*/20000);
  ASSERT_EQ(dc.num_finals.load(), 1);
  EXPECT_TRUE(dc.finals["r"].status.ok()) << dc.finals["r"].status;
  EXPECT_EQ(dc.tokens["r"], ref.tokens["r"]);
  EXPECT_EQ(pc.num_finals.load(), 1);
  // stats() is the snapshot after the loop's latest step: it may lag the final output.
  WaitFor([&] { return d.stats().num_kv_blocks_used == 0 && p.stats().num_kv_blocks_used == 0; });
  EXPECT_EQ(d.stats().num_kv_blocks_used, 0);
  EXPECT_EQ(p.stats().num_kv_blocks_used, 0);
}

// A lease nobody fills expires on the engine's clock although nothing else runs: the
// loop keeps stepping (in timed waits) while only parked requests are unfinished.
TEST(AsyncEngineTest, UnfilledLeaseExpiresWhileTheLoopIsOtherwiseIdle) {
  FakeKvStorageRunner runner(kVocab, kBs, 64);
  EngineOptions o = Options();
  o.lease_timeout_ms = 50;
  AsyncEngine engine(Engine::Create(o, runner).value());
  Collector c;
  ASSERT_TRUE(engine.SubmitWith(Req("r", Prompt(10, 1), 5, c), [](Engine& e, EngineRequest r) {
                 return e.ReserveForRemotePrefill(std::move(r)).status();
               }).ok());
  WaitFor([&] { return c.num_finals.load() == 1; });
  ASSERT_EQ(c.num_finals.load(), 1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.finals["r"].status)) << c.finals["r"].status;
  WaitFor([&] { return engine.stats().num_kv_blocks_used == 0; });
  EXPECT_EQ(engine.stats().num_kv_blocks_used, 0);
}

// A failed admission still gives the request exactly one final output, with the error.
TEST(AsyncEngineTest, SubmitWithRejectionIsTheFinalOutput) {
  FakeModelRunner runner(kVocab, kBs, 64);  // no KV storage: no leases
  AsyncEngine engine(Engine::Create(Options(), runner).value());
  Collector c;
  ASSERT_TRUE(engine.SubmitWith(Req("r", Prompt(4, 1), 5, c), [](Engine& e, EngineRequest r) {
                 return e.ReserveForRemotePrefill(std::move(r)).status();
               }).ok());
  engine.Drain(/*deadline_ms=*/20000);
  ASSERT_EQ(c.num_finals.load(), 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.finals["r"].status)) << c.finals["r"].status;
}

}  // namespace
}  // namespace kvmesh::engine
