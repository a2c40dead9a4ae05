// Prefill/decode disaggregation between two in-process Engines over fake runners whose
// KV lives in real KvStorage (fake_kv_storage_runner.h): a prefill engine P computes
// prompts and pins their blocks, a decode engine D leases blocks, receives P's blocks
// layer by layer, commits P's first token and decodes. Checks that the tokens are the
// reference ones (so every block of every layer arrived in the right place), and that
// every way a lease or a pinned prefill can end — commit, fail, abort, timeout, release
// — gives exactly one final output and strands no block.
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "fake_kv_storage_runner.h"
#include "fake_model_runner.h"

namespace kvmesh::engine {
namespace {

using testing::FakeKvStorageRunner;
using testing::FakeModelRunner;
using testing::ReferenceCompletion;

constexpr int32_t kBs = 4;
constexpr int32_t kVocab = 32;
constexpr int32_t kLayers = 2;
constexpr int64_t kTimeoutMs = 1000;

std::vector<int32_t> Prompt(int32_t n, int32_t start = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (start + i * 7) % kVocab;
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SamplingParams Greedy(int32_t max_tokens, int32_t logprobs = -1) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  p.logprobs = logprobs;
  return p;
}

SamplingParams Seeded(int32_t max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = seed;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, SamplingParams params, int32_t n = 1) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling_params = std::move(params);
  r.n = n;
  return r;
}

std::vector<int32_t> Reference(const EngineRequest& r, int32_t index) {
  SamplingParams p = r.sampling_params;
  if (p.seed.has_value()) p.seed = *p.seed + static_cast<uint64_t>(index);
  return ReferenceCompletion(r.prompt_token_ids, p, r.eos_token_ids, kVocab);
}

// Everything one engine streamed, through the requests' on_output callbacks (so every
// delivery path is covered: Step, Commit, Fail, Abort, Release, timeouts).
struct Recorder {
  void Record(const RequestOutput& o) {
    EXPECT_EQ(num_final[o.request_id], 0) << o.request_id << " got an output after its final one";
    for (const CompletionOutput& c : o.outputs) {
      std::vector<int32_t>& tokens = completions[o.request_id][c.index];
      tokens.insert(tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
      std::vector<SampleResult>& lp = logprobs[o.request_id][c.index];
      lp.insert(lp.end(), c.new_logprobs.begin(), c.new_logprobs.end());
      if (c.finished()) reasons[o.request_id][c.index] = c.finish_reason;
    }
    if (o.prefill_result.has_value()) {
      EXPECT_FALSE(prefill.contains(o.request_id)) << "two prefill results for " << o.request_id;
      EXPECT_FALSE(o.finished);
      prefill[o.request_id] = *o.prefill_result;
    }
    if (o.finished) {
      ++num_final[o.request_id];
      statuses[o.request_id] = o.status;
    }
  }

  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> completions;
  std::map<std::string, std::map<int32_t, std::vector<SampleResult>>> logprobs;
  std::map<std::string, std::map<int32_t, CompletionFinishReason>> reasons;
  std::map<std::string, int32_t> num_final;
  std::map<std::string, absl::Status> statuses;
  std::map<std::string, PrefillResult> prefill;
};

// One engine over a FakeKvStorageRunner with a shared fake clock.
struct Side {
  Side(int32_t num_blocks, const int64_t* clock, int32_t max_num_seqs = 8, int32_t budget = 2048,
       int32_t block_size = kBs)
      : runner(kVocab, block_size, num_blocks, kLayers) {
    EngineOptions o;
    o.kv.num_blocks = num_blocks;
    o.kv.block_size_tokens = block_size;
    o.max_model_len = 64;
    o.scheduler.max_num_seqs = max_num_seqs;
    o.scheduler.max_num_batched_tokens = budget;
    o.lease_timeout_ms = kTimeoutMs;
    o.prefill_release_timeout_ms = kTimeoutMs;
    o.now_ms = [clock] { return *clock; };
    engine = Engine::Create(o, runner).value();
  }

  EngineRequest Track(EngineRequest r) {
    r.on_output = [this](const RequestOutput& o) { rec.Record(o); };
    return r;
  }

  void Step() {
    absl::StatusOr<std::vector<RequestOutput>> outs = engine->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    const absl::Status inv = engine->scheduler().CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
  }

  void RunToCompletion(int32_t max_steps = 10000) {
    for (int32_t i = 0; i < max_steps && engine->HasUnfinishedRequests(); ++i) Step();
    ASSERT_FALSE(engine->HasUnfinishedRequests());
  }

  void ExpectNoBlockHeld() const {
    const kv::KvCacheManager& kv = engine->kv_cache();
    EXPECT_EQ(kv.num_used_blocks(), 0);
    EXPECT_EQ(kv.num_requests(), 0);
    EXPECT_EQ(kv.num_free_blocks() + kv.num_cached_blocks(), kv.num_blocks());
    const absl::Status inv = engine->scheduler().CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
  }

  FakeKvStorageRunner runner;
  std::unique_ptr<Engine> engine;
  Recorder rec;
};

// Copies every block the lease needs from P's pinned prefill to D, layer by layer.
absl::Status TransferBlocks(const Engine& p, Engine& d, const RemotePrefillLease& lease, const PrefillResult& result) {
  KVMESH_ASSIGN_OR_RETURN(const kv::KvBlockSpec sender, p.kv_block_spec());
  KVMESH_RETURN_IF_ERROR(kv::CheckKvBlockSpecsMatch(sender, lease.kv_spec));
  if (result.block_ids.size() != lease.block_ids.size()) return absl::InternalError("block counts differ");
  for (int32_t layer = 0; layer < lease.kv_spec.num_layers; ++layer) {
    for (int32_t i = result.num_skipped_blocks; i < lease.num_blocks(); ++i) {
      KVMESH_ASSIGN_OR_RETURN(const std::span<const std::byte> bytes, p.ExportKvBlock(lease.request_id, 0, layer, i));
      KVMESH_RETURN_IF_ERROR(d.ImportKvBlock(lease.transfer_id, 0, layer, i, bytes));
    }
  }
  return absl::OkStatus();
}

// Runs `requests` through P (prefill) and D (decode) as the workers will: reserve all on
// D, prefill all on P together, transfer, release, commit, then decode all on D.
void Disaggregate(Side& p, Side& d, const std::vector<EngineRequest>& requests,
                  std::vector<RemotePrefillLease>* leases_out = nullptr) {
  std::vector<RemotePrefillLease> leases;
  for (const EngineRequest& r : requests) {
    absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(r));
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->num_blocks(), (static_cast<int32_t>(r.prompt_token_ids.size()) + kBs - 1) / kBs);
    ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(r), lease->num_cached_tokens).ok());
    leases.push_back(*std::move(lease));
  }
  ASSERT_EQ(d.engine->stats().num_receiving_seqs, static_cast<int32_t>(requests.size()));
  for (int32_t i = 0; i < 1000; ++i) {
    p.Step();
    bool all = true;
    for (const EngineRequest& r : requests) all = all && p.rec.prefill.contains(r.request_id);
    if (all) break;
  }
  for (const RemotePrefillLease& lease : leases) {
    ASSERT_TRUE(p.rec.prefill.contains(lease.request_id)) << lease.request_id << " never prefilled";
    const PrefillResult& result = p.rec.prefill.at(lease.request_id);
    EXPECT_EQ(result.num_skipped_blocks, lease.num_cached_blocks());
    const absl::Status sent = TransferBlocks(*p.engine, *d.engine, lease, result);
    ASSERT_TRUE(sent.ok()) << sent;
    ASSERT_TRUE(p.engine->ReleasePrefill(lease.request_id).ok());
    absl::StatusOr<RequestOutput> committed =
        d.engine->CommitRemotePrefill(lease.transfer_id, result.first_token_id, result.first_token_logprobs);
    ASSERT_TRUE(committed.ok()) << committed.status();
  }
  d.RunToCompletion();
  if (leases_out != nullptr) *leases_out = std::move(leases);
}

class DisaggregationTest : public ::testing::Test {
 protected:
  int64_t now_ = 0;
};

TEST_F(DisaggregationTest, HandoffDecodesTheReferenceTokensAndReturnsEveryBlock) {
  Side p(64, &now_, 8, /*budget=*/6);  // a small budget: P's prompts are chunked
  Side d(64, &now_);
  const std::vector<int32_t> shared = Prompt(9, 3);  // 2 full blocks + 1 token
  std::vector<EngineRequest> wave1 = {
      Req("a", Concat(shared, Prompt(5, 11)), Greedy(10, /*logprobs=*/2)),
      Req("b", Prompt(8, 5), Seeded(12, 77)),  // prompt of exactly 2 blocks
      Req("c", Prompt(3, 2), Greedy(1)),       // the first token is its last
  };
  Disaggregate(p, d, wave1);
  // Second wave shares prefixes with the first: prefix hits on both sides.
  std::vector<EngineRequest> wave2 = {
      Req("d", Concat(shared, Prompt(7, 20)), Greedy(9)),
      Req("e", Concat(Prompt(8, 5), Prompt(6, 1)), Seeded(8, 5)),
  };
  std::vector<RemotePrefillLease> leases2;
  Disaggregate(p, d, wave2, &leases2);
  EXPECT_EQ(leases2[0].num_cached_tokens, 8);
  EXPECT_EQ(leases2[1].num_cached_tokens, 8);
  EXPECT_GT(p.rec.prefill.at("d").num_cached_tokens, 0);

  for (const std::vector<EngineRequest>* wave : {&wave1, &wave2}) {
    for (const EngineRequest& r : *wave) {
      EXPECT_EQ(d.rec.completions[r.request_id][0], Reference(r, 0)) << r.request_id;
      EXPECT_EQ(d.rec.num_final[r.request_id], 1) << r.request_id;
      EXPECT_EQ(p.rec.num_final[r.request_id], 1) << r.request_id;
      EXPECT_EQ(p.rec.reasons[r.request_id][0], CompletionFinishReason::kLength);
      EXPECT_TRUE(d.rec.statuses[r.request_id].ok()) << d.rec.statuses[r.request_id];
      // P's one output token is D's first.
      EXPECT_EQ(p.rec.completions[r.request_id][0], std::vector<int32_t>{Reference(r, 0).front()});
    }
  }
  // Logprobs cross over with the first token.
  ASSERT_EQ(d.rec.logprobs["a"][0].size(), 10u);
  EXPECT_EQ(d.rec.logprobs["a"][0][0].top_logprobs.size(), 2u);
  EXPECT_EQ(d.rec.logprobs["a"][0][0].token_id, Reference(wave1[0], 0).front());
  EXPECT_EQ(d.rec.reasons["c"][0], CompletionFinishReason::kLength);

  const EngineStats ds = d.engine->stats();
  EXPECT_EQ(ds.num_leases_granted, 5);
  EXPECT_EQ(ds.num_leases_committed, 5);
  EXPECT_GT(ds.prefix_cache_hit_tokens, 0);
  EXPECT_GT(p.engine->stats().prefix_cache_hit_tokens, 0);
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
}

// The decode side's cached blocks (what the prefill side skips) and the prefill side's
// own hits both depend on the request's cache_salt: another salt is a miss on both.
TEST_F(DisaggregationTest, HandoffSharesCachedBlocksOnlyWithinACacheSalt) {
  Side p(64, &now_);
  Side d(64, &now_);
  const std::vector<int32_t> shared = Prompt(9, 3);  // 2 full blocks + 1 token
  auto salted = [&](const std::string& id, std::vector<int32_t> tail, const std::string& salt) {
    EngineRequest r = Req(id, Concat(shared, tail), Greedy(4));
    r.cache_salt = salt;
    return r;
  };
  const std::vector<EngineRequest> first = {salted("a1", Prompt(5, 11), "tenant-a")};
  Disaggregate(p, d, first);
  const std::vector<EngineRequest> second = {salted("b1", Prompt(6, 20), "tenant-b"),
                                             salted("a2", Prompt(6, 30), "tenant-a")};
  std::vector<RemotePrefillLease> leases;
  Disaggregate(p, d, second, &leases);
  ASSERT_EQ(leases.size(), 2u);
  EXPECT_EQ(leases[0].num_cached_tokens, 0);  // tenant-b: D's blocks of tenant-a are not its own
  EXPECT_EQ(p.rec.prefill.at("b1").num_cached_tokens, 0);
  EXPECT_EQ(leases[1].num_cached_tokens, 8);  // tenant-a again: both full shared blocks
  EXPECT_GT(p.rec.prefill.at("a2").num_cached_tokens, 0);
  for (const std::vector<EngineRequest>* wave : {&first, &second}) {
    for (const EngineRequest& r : *wave) EXPECT_EQ(d.rec.completions[r.request_id][0], Reference(r, 0)) << r.request_id;
  }
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, ParallelSamplesForkAfterCommit) {
  Side p(64, &now_);
  Side d(64, &now_);
  const EngineRequest r = Req("n3", Prompt(10, 4), Seeded(7, 1234), /*n=*/3);
  Disaggregate(p, d, {r});
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(d.rec.completions["n3"][i], Reference(r, i)) << "sample " << i;
  // The prefill side computed it as one sample.
  EXPECT_EQ(p.rec.completions["n3"].size(), 1u);
  EXPECT_EQ(p.rec.completions["n3"][0], std::vector<int32_t>{Reference(r, 0).front()});
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, CommitAdmitsAlongsideLocalRequests) {
  Side p(64, &now_);
  Side d(64, &now_);
  const EngineRequest local = Req("local", Prompt(6, 9), Greedy(20));
  ASSERT_TRUE(d.engine->AddRequest(d.Track(local)).ok());
  d.Step();
  d.Step();
  const EngineRequest remote = Req("remote", Prompt(11, 1), Greedy(6));
  Disaggregate(p, d, {remote});
  EXPECT_EQ(d.rec.completions["local"][0], Reference(local, 0));
  EXPECT_EQ(d.rec.completions["remote"][0], Reference(remote, 0));
  d.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, FailFreesTheLeaseAndEndsTheRequestWithItsError) {
  Side d(16, &now_);
  absl::StatusOr<RemotePrefillLease> lease =
      d.engine->ReserveForRemotePrefill(d.Track(Req("f", Prompt(10), Greedy(4), /*n=*/2)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(d.engine->kv_cache().num_used_blocks(), 3);
  EXPECT_EQ(d.engine->stats().num_receiving_seqs, 1);
  EXPECT_TRUE(d.engine->HasUnfinishedRequests());
  // Never scheduled while receiving.
  d.Step();
  EXPECT_EQ(d.runner.num_executes(), 0);

  EXPECT_EQ(d.engine->FailRemotePrefill(lease->transfer_id, absl::OkStatus()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<RequestOutput> out =
      d.engine->FailRemotePrefill(lease->transfer_id, absl::UnavailableError("peer down"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->finished);
  EXPECT_EQ(out->status.code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(out->outputs.size(), 2u);  // both samples end, though never forked
  EXPECT_EQ(d.rec.num_final["f"], 1);
  EXPECT_EQ(d.rec.reasons["f"][0], CompletionFinishReason::kError);
  EXPECT_EQ(d.rec.reasons["f"][1], CompletionFinishReason::kError);
  d.ExpectNoBlockHeld();
  EXPECT_FALSE(d.engine->HasUnfinishedRequests());
  EXPECT_EQ(d.engine->stats().num_leases_failed, 1);

  // The lease is gone: every further call is rejected.
  const std::vector<std::byte> block(static_cast<size_t>(lease->kv_spec.block_bytes));
  EXPECT_EQ(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 0, block).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->FailRemotePrefill(lease->transfer_id, absl::AbortedError("x")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DisaggregationTest, AbortWhileReceivingFreesTheLease) {
  Side d(16, &now_);
  absl::StatusOr<RemotePrefillLease> lease =
      d.engine->ReserveForRemotePrefill(d.Track(Req("x", Prompt(13), Greedy(4))));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::vector<std::byte> block(static_cast<size_t>(lease->kv_spec.block_bytes));
  ASSERT_TRUE(d.engine->ImportKvBlock(lease->transfer_id, 0, 1, 2, block).ok());
  absl::StatusOr<RequestOutput> out = d.engine->Abort("x");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->finished);
  EXPECT_EQ(d.rec.reasons["x"][0], CompletionFinishReason::kAbort);
  EXPECT_EQ(d.rec.num_final["x"], 1);
  d.ExpectNoBlockHeld();
  EXPECT_EQ(d.engine->stats().num_leases_aborted, 1);
  EXPECT_EQ(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 1, block).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The id is free again.
  EXPECT_TRUE(d.engine->ReserveForRemotePrefill(Req("x", Prompt(13), Greedy(4))).ok());
}

TEST_F(DisaggregationTest, ExpiredLeaseIsRejectedThenReclaimedByStep) {
  Side d(16, &now_);
  absl::StatusOr<RemotePrefillLease> lease =
      d.engine->ReserveForRemotePrefill(d.Track(Req("late", Prompt(9), Greedy(4))));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->deadline_ms, kTimeoutMs);
  const std::vector<std::byte> block(static_cast<size_t>(lease->kv_spec.block_bytes));
  now_ = kTimeoutMs - 1;
  d.Step();
  EXPECT_TRUE(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 0, block).ok());
  EXPECT_EQ(d.rec.num_final["late"], 0);
  now_ = kTimeoutMs;
  // Expired: rejected at once, even before Step reclaims it.
  EXPECT_EQ(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 1, block).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->kv_cache().num_used_blocks(), 3);
  d.Step();
  EXPECT_EQ(d.rec.num_final["late"], 1);
  EXPECT_EQ(d.rec.reasons["late"][0], CompletionFinishReason::kError);
  EXPECT_EQ(d.rec.statuses["late"].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(d.engine->stats().num_leases_expired, 1);
  d.ExpectNoBlockHeld();
  EXPECT_FALSE(d.engine->HasUnfinishedRequests());
}

TEST_F(DisaggregationTest, ImportAfterCommitIsRejected) {
  Side p(32, &now_);
  Side d(32, &now_);
  std::vector<RemotePrefillLease> leases;
  const EngineRequest r = Req("done", Prompt(10), Greedy(3));
  Disaggregate(p, d, {r}, &leases);
  EXPECT_EQ(d.rec.completions["done"][0], Reference(r, 0));
  const std::vector<std::byte> block(static_cast<size_t>(leases[0].kv_spec.block_bytes));
  EXPECT_EQ(d.engine->ImportKvBlock(leases[0].transfer_id, 0, 0, 1, block).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->CommitRemotePrefill(leases[0].transfer_id, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->FailRemotePrefill(leases[0].transfer_id, absl::InternalError("late")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  d.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, ImportChecksLayoutRangeAndCachedBlocks) {
  Side d(32, &now_);
  // Put 2 blocks of a prompt into D's prefix cache first.
  const std::vector<int32_t> prompt = Prompt(11, 6);
  ASSERT_TRUE(d.engine->AddRequest(Req("warm", prompt, Greedy(1))).ok());
  d.RunToCompletion();
  absl::StatusOr<RemotePrefillLease> lease =
      d.engine->ReserveForRemotePrefill(d.Track(Req("r", Concat(prompt, Prompt(3)), Greedy(2))));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->num_cached_tokens, 8);
  ASSERT_EQ(lease->num_cached_blocks(), 2);
  ASSERT_EQ(lease->num_blocks(), 4);
  const kv::KvBlockSpec spec = d.engine->kv_block_spec().value();
  EXPECT_EQ(lease->kv_spec, spec);
  EXPECT_EQ(spec.num_layers, kLayers);
  EXPECT_EQ(spec.block_size_tokens, kBs);

  const std::vector<std::byte> block(static_cast<size_t>(spec.block_bytes));
  const std::vector<std::byte> short_block(static_cast<size_t>(spec.block_bytes - 4));
  const std::vector<std::byte> long_block(static_cast<size_t>(spec.block_bytes * 2));
  const KvTransferId id = lease->transfer_id;
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, 0, 2, short_block).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, 0, 2, long_block).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, kLayers, 2, block).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, -1, 2, block).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, 0, 4, block).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.engine->ImportKvBlock(id, 0, 0, 1, block).code(), absl::StatusCode::kInvalidArgument)
      << "a prefix-cache block must never be overwritten";
  EXPECT_EQ(d.engine->ImportKvBlock(KvTransferId{999}, 0, 0, 2, block).code(), absl::StatusCode::kFailedPrecondition);

  // A sender with another block size (or layer count) is refused before sending.
  Side other(32, &now_, 8, 2048, /*block_size=*/8);
  absl::Status mismatch = kv::CheckKvBlockSpecsMatch(other.engine->kv_block_spec().value(), lease->kv_spec);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("block_size_tokens"), std::string::npos) << mismatch;

  // Some but not all blocks imported: the commit is refused, the lease stays open.
  ASSERT_TRUE(d.engine->ImportKvBlock(id, 0, 0, 2, block).ok());
  EXPECT_EQ(d.engine->CommitRemotePrefill(id, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->stats().num_receiving_seqs, 1);
  ASSERT_TRUE(d.engine->FailRemotePrefill(id, absl::DataLossError("bad block")).ok());
  d.ExpectNoBlockHeld();
  // The warm request's cached blocks are still intact and cached.
  EXPECT_GE(d.engine->kv_cache().num_cached_blocks(), 2);
}

TEST_F(DisaggregationTest, CommitValidatesTokenAndLogprobsWithoutSideEffects) {
  Side p(32, &now_);
  Side d(32, &now_);
  const EngineRequest r = Req("lp", Prompt(6), Greedy(4, /*logprobs=*/1));
  absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(r));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(r), lease->num_cached_tokens).ok());
  while (!p.rec.prefill.contains("lp")) p.Step();
  const PrefillResult result = p.rec.prefill.at("lp");
  ASSERT_TRUE(result.first_token_logprobs.has_value());
  ASSERT_TRUE(TransferBlocks(*p.engine, *d.engine, *lease, result).ok());

  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, kVocab).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, result.first_token_id).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "logprobs were asked for";
  SampleResult wrong = *result.first_token_logprobs;
  wrong.token_id = (wrong.token_id + 1) % kVocab;
  EXPECT_EQ(d.engine->CommitRemotePrefill(lease->transfer_id, result.first_token_id, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.rec.completions["lp"].size(), 0u);
  EXPECT_EQ(d.engine->stats().num_receiving_seqs, 1);

  absl::StatusOr<RequestOutput> out =
      d.engine->CommitRemotePrefill(lease->transfer_id, result.first_token_id, result.first_token_logprobs);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->outputs.size(), 1u);
  EXPECT_EQ(out->outputs[0].new_token_ids, std::vector<int32_t>{result.first_token_id});
  EXPECT_EQ(out->outputs[0].new_logprobs.size(), 1u);
  EXPECT_FALSE(out->finished);
  ASSERT_TRUE(p.engine->ReleasePrefill("lp").ok());
  d.RunToCompletion();
  EXPECT_EQ(d.rec.completions["lp"][0], Reference(r, 0));
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, StopTokenAsFirstTokenFinishesAtCommit) {
  Side p(32, &now_);
  Side d(32, &now_);
  EngineRequest r = Req("eos", Prompt(7), Greedy(8));
  r.sampling_params.ignore_eos = false;
  r.eos_token_ids = {Reference(Req("eos", Prompt(7), Greedy(8)), 0).front()};
  std::vector<RemotePrefillLease> leases;
  Disaggregate(p, d, {r}, &leases);
  EXPECT_EQ(d.rec.completions["eos"][0].size(), 1u);
  EXPECT_EQ(d.rec.reasons["eos"][0], CompletionFinishReason::kStop);
  // The prefill side does not stop-check: it reports "length" for its one token.
  EXPECT_EQ(p.rec.reasons["eos"][0], CompletionFinishReason::kLength);
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
  // Committed prompt blocks entered D's prefix cache.
  EXPECT_EQ(d.engine->kv_cache().num_cached_blocks(), 1);
}

TEST_F(DisaggregationTest, ReserveFailsWithoutSideEffects) {
  Side d(4, &now_, /*max_num_seqs=*/2);
  // Validation as AddRequest.
  EXPECT_EQ(d.engine->ReserveForRemotePrefill(Req("bad", {}, Greedy(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.engine->ReserveForRemotePrefill(Req("bad", {kVocab}, Greedy(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The pool (4 blocks) is short while a lease holds 3 of them.
  absl::StatusOr<RemotePrefillLease> first = d.engine->ReserveForRemotePrefill(Req("one", Prompt(9), Greedy(2)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(d.engine->ReserveForRemotePrefill(Req("one", Prompt(3), Greedy(2))).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(d.engine->ReserveForRemotePrefill(Req("two", Prompt(9), Greedy(2))).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.engine->kv_cache().num_used_blocks(), 3);
  EXPECT_EQ(d.engine->kv_cache().num_requests(), 1);
  // Sequence slots: "one" holds 1 of 2, so an n = 2 reservation does not fit.
  EXPECT_EQ(d.engine->ReserveForRemotePrefill(Req("pair", Prompt(2), Greedy(2), 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // ... and a reservation's slot counts against local admissions too.
  ASSERT_TRUE(d.engine->AddRequest(Req("local", Prompt(2), Greedy(2), 2)).ok());
  d.Step();
  EXPECT_EQ(d.engine->stats().num_running_seqs, 0) << "the local n = 2 request must wait for a slot";
  ASSERT_TRUE(d.engine->Abort("one").ok());
  d.RunToCompletion();
  d.ExpectNoBlockHeld();
  const absl::Status inv = d.engine->scheduler().CheckInvariants();
  EXPECT_TRUE(inv.ok()) << inv;

  // A runner without KvStorage cannot take remote prefills.
  FakeModelRunner plain(kVocab, kBs, 8);
  EngineOptions o;
  o.kv.num_blocks = 8;
  o.kv.block_size_tokens = kBs;
  o.max_model_len = 32;
  auto engine = Engine::Create(o, plain).value();
  EXPECT_EQ(engine->ReserveForRemotePrefill(Req("r", Prompt(3), Greedy(2))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
}

TEST_F(DisaggregationTest, PinnedPrefillEndsByReleaseAbortOrTimeout) {
  Side p(32, &now_);
  for (const char* id : {"rel", "abort", "late"}) {
    ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(Req(id, Prompt(9, id[0]), Greedy(5))), 0).ok());
  }
  // Not computed yet: nothing to export or release.
  EXPECT_EQ(p.engine->ExportKvBlock("rel", 0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.engine->ReleasePrefill("rel").status().code(), absl::StatusCode::kFailedPrecondition);
  p.Step();
  ASSERT_EQ(p.rec.prefill.size(), 3u);
  EXPECT_EQ(p.engine->stats().num_prefilled_seqs, 3);
  EXPECT_EQ(p.engine->kv_cache().num_used_blocks(), 9);
  // Pinned blocks are not scheduled again.
  const int64_t executes = p.runner.num_executes();
  p.Step();
  EXPECT_EQ(p.runner.num_executes(), executes);
  const PrefillResult& rel = p.rec.prefill.at("rel");
  EXPECT_EQ(rel.block_ids.size(), 3u);
  EXPECT_EQ(rel.first_token_id, Reference(Req("rel", Prompt(9, 'r'), Greedy(5)), 0).front());
  EXPECT_FALSE(rel.first_token_logprobs.has_value());
  EXPECT_TRUE(p.engine->ExportKvBlock("rel", 0, 1, 2).ok());
  EXPECT_EQ(p.engine->ExportKvBlock("rel", 0, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.engine->ExportKvBlock("rel", 0, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<RequestOutput> released = p.engine->ReleasePrefill("rel");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_TRUE(released->finished);
  EXPECT_EQ(p.rec.reasons["rel"][0], CompletionFinishReason::kLength);
  EXPECT_EQ(p.engine->ExportKvBlock("rel", 0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.engine->ReleasePrefill("rel").status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(p.engine->Abort("abort").ok());
  EXPECT_EQ(p.rec.reasons["abort"][0], CompletionFinishReason::kAbort);
  EXPECT_EQ(p.engine->ExportKvBlock("abort", 0, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);

  now_ = kTimeoutMs;
  p.Step();
  EXPECT_EQ(p.rec.num_final["late"], 1);
  EXPECT_EQ(p.rec.reasons["late"][0], CompletionFinishReason::kError);
  EXPECT_EQ(p.rec.statuses["late"].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.engine->stats().num_prefill_releases_expired, 1);
  for (const char* id : {"rel", "abort", "late"}) EXPECT_EQ(p.rec.num_final[id], 1) << id;
  p.ExpectNoBlockHeld();
  EXPECT_FALSE(p.engine->HasUnfinishedRequests());
  // Released prompt blocks stay cached for the next prefill.
  EXPECT_GE(p.engine->kv_cache().num_cached_blocks(), 6);
}

TEST_F(DisaggregationTest, AbortMidPrefillAndSkipValidation) {
  Side p(32, &now_, 8, /*budget=*/4);
  ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(Req("mid", Prompt(20), Greedy(5))), 8).ok());
  p.Step();  // 4 of 20 tokens
  EXPECT_FALSE(p.rec.prefill.contains("mid"));
  ASSERT_TRUE(p.engine->Abort("mid").ok());
  EXPECT_EQ(p.rec.reasons["mid"][0], CompletionFinishReason::kAbort);
  p.ExpectNoBlockHeld();

  EXPECT_EQ(p.engine->AddPrefillOnlyRequest(Req("s", Prompt(9), Greedy(2)), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.engine->AddPrefillOnlyRequest(Req("s", Prompt(8), Greedy(2)), 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.engine->AddPrefillOnlyRequest(Req("s", Prompt(8), Greedy(2)), -4).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(Req("s", Prompt(9), Greedy(2)), 8).ok());
  EXPECT_EQ(p.engine->AddPrefillOnlyRequest(Req("s", Prompt(9), Greedy(2)), 0).code(),
            absl::StatusCode::kAlreadyExists);
  while (!p.engine->ExportKvBlock("s", 0, 0, 0).ok()) p.Step();
  ASSERT_TRUE(p.engine->ReleasePrefill("s").ok());
  p.ExpectNoBlockHeld();
}

TEST_F(DisaggregationTest, PreemptionNeverTouchesLeasesOrPinnedPrefills) {
  // D: 10 blocks. A lease pins 3; two local requests compete for the other 7 and
  // preempt each other, never the lease.
  Side p(32, &now_);
  Side d(10, &now_, 8, /*budget=*/64);
  const EngineRequest remote = Req("remote", Prompt(11, 2), Greedy(6));
  absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(remote));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const EngineRequest l1 = Req("l1", Prompt(6, 3), Greedy(14));
  const EngineRequest l2 = Req("l2", Prompt(6, 8), Greedy(14));
  ASSERT_TRUE(d.engine->AddRequest(d.Track(l1)).ok());
  ASSERT_TRUE(d.engine->AddRequest(d.Track(l2)).ok());
  for (int i = 0; i < 200 && (d.rec.num_final["l1"] == 0 || d.rec.num_final["l2"] == 0); ++i) d.Step();
  EXPECT_GT(d.engine->stats().num_preemptions, 0);
  EXPECT_EQ(d.rec.completions["l1"][0], Reference(l1, 0));
  EXPECT_EQ(d.rec.completions["l2"][0], Reference(l2, 0));
  EXPECT_EQ(d.engine->stats().num_receiving_seqs, 1);

  ASSERT_TRUE(p.engine->AddPrefillOnlyRequest(p.Track(remote), lease->num_cached_tokens).ok());
  while (!p.rec.prefill.contains("remote")) p.Step();
  ASSERT_TRUE(TransferBlocks(*p.engine, *d.engine, *lease, p.rec.prefill.at("remote")).ok());
  ASSERT_TRUE(p.engine->ReleasePrefill("remote").ok());
  ASSERT_TRUE(d.engine->CommitRemotePrefill(lease->transfer_id, p.rec.prefill.at("remote").first_token_id).ok());
  d.RunToCompletion();
  EXPECT_EQ(d.rec.completions["remote"][0], Reference(remote, 0));
  p.ExpectNoBlockHeld();
  d.ExpectNoBlockHeld();
}

}  // namespace
}  // namespace kvmesh::engine

namespace kvmesh::engine {
namespace {

// ---- Recovering from faults: local fallback, resume (migration), hand-back on drain ----

TEST_F(DisaggregationTest, FallBackToLocalPrefillFreesTheLeaseAndDecodesTheReferenceTokens) {
  Side d(16, &now_);
  const EngineRequest r = Req("fb", Prompt(10), Greedy(5));
  absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(r));
  ASSERT_TRUE(lease.ok()) << lease.status();
  // Part of the KV landed (garbage) before the sender died: it must not be used.
  std::vector<std::byte> garbage(static_cast<size_t>(lease->kv_spec.block_bytes), std::byte{0x5a});
  ASSERT_TRUE(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 0, garbage).ok());
  ASSERT_TRUE(d.engine->FallBackToLocalPrefill(lease->transfer_id, absl::UnavailableError("prefill died")).ok());
  EXPECT_EQ(d.engine->stats().num_leases_failed, 1);
  EXPECT_EQ(d.engine->stats().num_remote_prefill_fallbacks, 1);
  EXPECT_EQ(d.engine->stats().num_receiving_seqs, 0);
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);
  EXPECT_EQ(d.rec.num_final["fb"], 0);  // no error reached the client
  // The lease is gone; the request lives on.
  EXPECT_EQ(d.engine->ImportKvBlock(lease->transfer_id, 0, 0, 1, garbage).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.engine->FallBackToLocalPrefill(lease->transfer_id, absl::UnavailableError("again")).code(),
            absl::StatusCode::kFailedPrecondition);
  d.RunToCompletion();
  EXPECT_EQ(d.rec.num_final["fb"], 1);
  EXPECT_TRUE(d.rec.statuses["fb"].ok()) << d.rec.statuses["fb"];
  EXPECT_EQ(d.rec.completions["fb"][0], Reference(r, 0));
  d.ExpectNoBlockHeld();
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);
}

TEST_F(DisaggregationTest, FallBackAfterAbortIsRefusedAndStrandsNothing) {
  Side d(16, &now_);
  absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(Req("ab", Prompt(9), Greedy(3))));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(d.engine->Abort("ab").ok());
  EXPECT_EQ(d.engine->FallBackToLocalPrefill(lease->transfer_id, absl::UnavailableError("late")).code(),
            absl::StatusCode::kFailedPrecondition);
  d.ExpectNoBlockHeld();
}

// How a lease ends without a commit.
enum class LeaseEnding { kFail, kFallBack, kAbort, kExpire };

class QuarantineTest : public ::testing::TestWithParam<LeaseEnding> {
 protected:
  int64_t now_ = 0;
};

// A transport that writes a lease's blocks itself (cross-memory attach) may have a
// writer that outlives the lease: stopped mid-write, it lands its write whenever it
// resumes. However the lease ends, its blocks stay out of the pool until the transport
// says its writers are gone, so the late write never reaches another request's KV; the
// other request waits for blocks instead, and decodes the reference tokens.
TEST_P(QuarantineTest, BlocksOfALeaseEndedUncommittedStayOutOfUseUntilItsWritersAreGone) {
  Side d(/*num_blocks=*/4, &now_);
  const EngineRequest leased = Req("leased", Prompt(10), Greedy(2));
  absl::StatusOr<RemotePrefillLease> lease = d.engine->ReserveForRemotePrefill(d.Track(leased));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->num_blocks(), 3);
  d.engine->ExpectDirectKvWrites(lease->transfer_id);
  switch (GetParam()) {
    case LeaseEnding::kFail:
      ASSERT_TRUE(d.engine->FailRemotePrefill(lease->transfer_id, absl::DeadlineExceededError("sender quiet")).ok());
      break;
    case LeaseEnding::kFallBack:
      ASSERT_TRUE(d.engine->FallBackToLocalPrefill(lease->transfer_id, absl::UnavailableError("sender quiet")).ok());
      break;
    case LeaseEnding::kAbort:
      ASSERT_TRUE(d.engine->Abort("leased").ok());
      break;
    case LeaseEnding::kExpire:
      now_ += kTimeoutMs;
      d.Step();
      break;
  }
  EXPECT_EQ(d.engine->stats().num_kv_blocks_quarantined, 3);
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);  // not before a lease timeout passed
  const EngineRequest other = Req("other", Prompt(6, 5), Greedy(8));
  ASSERT_TRUE(d.engine->AddRequest(d.Track(other)).ok());
  for (int i = 0; i < 2; ++i) d.Step();
  // The stopped writer resumes: its late write lands in the quarantined blocks.
  for (const kv::BlockId b : lease->block_ids) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      const std::span<std::byte> bytes = d.runner.kv_storage()->BlockData(layer, b);
      std::memset(bytes.data(), 0x5a, bytes.size());
    }
  }
  EXPECT_EQ(d.engine->stats().num_kv_blocks_quarantined, 3);
  d.engine->KvWritersGone(lease->transfer_id);
  EXPECT_EQ(d.engine->stats().num_kv_blocks_quarantined, 0);
  d.RunToCompletion();
  EXPECT_TRUE(d.rec.statuses["other"].ok()) << d.rec.statuses["other"];
  EXPECT_EQ(d.rec.completions["other"][0], Reference(other, 0)) << "a late write reached another request's KV";
  if (GetParam() == LeaseEnding::kFallBack) {
    EXPECT_TRUE(d.rec.statuses["leased"].ok()) << d.rec.statuses["leased"];
    EXPECT_EQ(d.rec.completions["leased"][0], Reference(leased, 0));
  }
  d.ExpectNoBlockHeld();
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);
  EXPECT_TRUE(d.engine->kv_cache().CheckInvariants().ok());
}

// A quarantine that lasts a lease timeout (a writer stopped for good) is reported as
// stranded; writers that were gone before the lease ended quarantine nothing.
TEST_F(DisaggregationTest, AQuarantineThatLastsALeaseTimeoutIsStrandedAndGoneWritersQuarantineNothing) {
  Side d(8, &now_);
  absl::StatusOr<RemotePrefillLease> stuck = d.engine->ReserveForRemotePrefill(d.Track(Req("s", Prompt(10), Greedy(2))));
  absl::StatusOr<RemotePrefillLease> done = d.engine->ReserveForRemotePrefill(d.Track(Req("g", Prompt(5), Greedy(2))));
  ASSERT_TRUE(stuck.ok() && done.ok());
  d.engine->ExpectDirectKvWrites(stuck->transfer_id);
  d.engine->ExpectDirectKvWrites(done->transfer_id);
  d.engine->KvWritersGone(done->transfer_id);  // e.g. the sender's process died first
  ASSERT_TRUE(d.engine->FailRemotePrefill(stuck->transfer_id, absl::DeadlineExceededError("quiet")).ok());
  ASSERT_TRUE(d.engine->FailRemotePrefill(done->transfer_id, absl::UnavailableError("dead")).ok());
  EXPECT_EQ(d.engine->stats().num_kv_blocks_quarantined, 3);
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);
  now_ += kTimeoutMs;
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 3);
  d.engine->KvWritersGone(stuck->transfer_id);
  d.engine->KvWritersGone(stuck->transfer_id);  // twice: nothing more to release
  d.ExpectNoBlockHeld();
  EXPECT_EQ(d.engine->stats().num_kv_blocks_stranded, 0);
}

std::string EndingName(const ::testing::TestParamInfo<LeaseEnding>& info) {
  static constexpr const char* kNames[] = {"Fail", "FallBack", "Abort", "Expire"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Endings, QuarantineTest,
                         ::testing::Values(LeaseEnding::kFail, LeaseEnding::kFallBack, LeaseEnding::kAbort,
                                           LeaseEnding::kExpire),
                         EndingName);

// A request resumed from the tokens another engine streamed continues the same stream:
// greedy, and seeded (the sampler skips one draw per carried token).
TEST_F(DisaggregationTest, ResumedRequestContinuesWithTheTokensAnUndisturbedRunProduces) {
  for (const SamplingParams& params : {Greedy(9), Seeded(9, 1234)}) {
    Side d(32, &now_);
    const EngineRequest full = Req("full", Prompt(11, 2), params);
    const std::vector<int32_t> reference = Reference(full, 0);
    ASSERT_EQ(reference.size(), 9u);
    for (const size_t carried : {size_t{1}, size_t{4}, size_t{8}}) {
      EngineRequest resumed = full;
      resumed.request_id = absl::StrCat("resumed-", carried);
      resumed.resume_output_token_ids.assign(reference.begin(), reference.begin() + static_cast<long>(carried));
      d.rec.completions[resumed.request_id][0] = resumed.resume_output_token_ids;  // what the client already has
      ASSERT_TRUE(d.engine->AddRequest(d.Track(resumed)).ok());
      d.RunToCompletion();
      EXPECT_EQ(d.rec.completions[resumed.request_id][0], reference)
          << "carried " << carried << " seeded " << params.seed.has_value();
      EXPECT_EQ(d.rec.reasons[resumed.request_id][0], CompletionFinishReason::kLength);
    }
    d.ExpectNoBlockHeld();
  }
}

TEST_F(DisaggregationTest, ResumeIsValidated) {
  Side d(32, &now_);
  EngineRequest r = Req("bad", Prompt(5), Greedy(3));
  r.resume_output_token_ids = {1, 2, 3};  // as many as max_tokens: nothing left to do
  EXPECT_EQ(d.engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.resume_output_token_ids = {kVocab};
  EXPECT_EQ(d.engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r = Req("bad-n", Prompt(5), Greedy(3), /*n=*/2);
  r.resume_output_token_ids = {1};
  EXPECT_EQ(d.engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DisaggregationTest, HandBackUnstartedEndsOnlyTheRequestsThatNeverRan) {
  Side d(32, &now_, /*max_num_seqs=*/1);
  ASSERT_TRUE(d.engine->AddRequest(d.Track(Req("running", Prompt(6), Greedy(4)))).ok());
  ASSERT_TRUE(d.engine->AddRequest(d.Track(Req("queued", Prompt(7, 3), Greedy(4)))).ok());
  d.Step();  // "running" is admitted; "queued" waits for the one sequence slot
  EXPECT_EQ(d.engine->HandBackUnstarted(absl::OkStatus()).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<RequestOutput>> handed = d.engine->HandBackUnstarted(absl::AbortedError("draining"));
  ASSERT_TRUE(handed.ok()) << handed.status();
  ASSERT_EQ(handed->size(), 1u);
  EXPECT_EQ((*handed)[0].request_id, "queued");
  EXPECT_EQ(d.rec.statuses["queued"].code(), absl::StatusCode::kAborted);
  d.RunToCompletion();
  EXPECT_TRUE(d.rec.statuses["running"].ok());
  EXPECT_EQ(d.rec.completions["running"][0].size(), 4u);
  d.ExpectNoBlockHeld();
}

}  // namespace
}  // namespace kvmesh::engine
