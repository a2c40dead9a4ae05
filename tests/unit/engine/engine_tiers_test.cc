// The KV hierarchy end to end on the real model (PagedModelRunner): a request whose
// prefix comes from tier 0, the host tier, the disk tier (after a restart) or is
// recomputed produces bit-identical greedy tokens and logprobs, on the default bf16 tiny
// model and on an f32 model. A corrupted disk block is recomputed (and counted), never
// served. A randomized soak checks the KV owner's invariants and that nothing is
// stranded after every step.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "../kv/in_memory_kv_connector.h"
#include "generation_checks.h"
#include "engine/paged_model_runner.h"
#include "engine/tensor_parallel_runner.h"

namespace kvmesh::engine {
namespace {

using testing_util::ExpectIdentical;
using testing_util::Generation;

constexpr int32_t kBlock = 16;


std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/kvmesh_tiers_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

class EngineTiersTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto backend = backend::CreateCpuBackend({.num_threads = 2});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
  }

  struct Worker {
    std::unique_ptr<PagedModelRunner> runner;
    std::unique_ptr<Engine> engine;
  };

  Worker MakeWorker(int32_t num_blocks, EngineKvTierOptions tiers) {
    Worker w;
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = kBlock, .num_blocks = num_blocks});
    EXPECT_TRUE(runner.ok()) << runner.status();
    w.runner = std::move(runner).value();
    w.engine = MakeEngine(*w.runner, std::move(tiers));
    return w;
  }

  // The engine every test here runs: small steps, no events, the given tiers.
  static std::unique_ptr<Engine> MakeEngine(ModelRunner& runner, EngineKvTierOptions tiers) {
    return testing_util::MakeSmallStepEngine(runner, std::move(tiers), kBlock);
  }

  static Generation Generate(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt,
                             int32_t max_tokens) {
    return testing_util::GenerateChecked(engine, id, prompt, max_tokens);
  }

  // A host tier of 64 slots (write-through) over one InMemoryKvConnector on `shared`: a
  // worker's view of a cluster store that several workers share.
  static EngineKvTierOptions TiersOver(kv::InMemoryBlocks& shared, int64_t slot_bytes) {
    EngineKvTierOptions t{.host_cache_bytes = 64 * slot_bytes, .write_through = true};
    t.make_connectors = [&shared](const KvSlotShape&, int64_t) {
      std::vector<std::unique_ptr<kv::KvConnector>> c;
      c.push_back(std::make_unique<kv::InMemoryKvConnector>(shared));
      return absl::StatusOr<std::vector<std::unique_ptr<kv::KvConnector>>>(std::move(c));
    };
    return t;
  }

  static std::vector<int32_t> RandomPrompt(std::mt19937& rng, int32_t n) {
    std::uniform_int_distribution<int32_t> token(0, 250);
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = token(rng);
    return p;
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(EngineTiersTest, PrefixFromEveryTierGivesBitIdenticalOutput) {
  std::mt19937 rng(7);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);  // 6 full blocks + 4 tokens
  std::vector<std::vector<int32_t>> fillers;
  for (int i = 0; i < 3; ++i) fillers.push_back(RandomPrompt(rng, 180));

  // Recompute: no tiers, a fresh engine.
  Worker plain = MakeWorker(64, {});
  const Generation recomputed = Generate(*plain.engine, "p", prompt, 12);
  // Tier 0: the same engine again; the prompt's blocks are cached.
  const Generation from_device = Generate(*plain.engine, "p2", prompt, 12);
  EXPECT_GT(plain.engine->stats().prefix_cache_hit_tokens, 0);
  ExpectIdentical(from_device, recomputed, "tier-0 prefix vs recompute");

  // Host (and disk): a pool of 16 blocks, so that the fillers evict the prompt's blocks.
  const std::string dir = TempDir(GetParam());
  const int64_t slot_bytes = plain.runner->kv_swap_bytes_per_block();
  EngineKvTierOptions tiers{.host_cache_bytes = 64 * slot_bytes, .disk_cache_dir = dir,
                            .disk_cache_bytes = 256 * slot_bytes};
  {
    Worker tiered = MakeWorker(16, tiers);
    const Generation first = Generate(*tiered.engine, "p", prompt, 12);
    ExpectIdentical(first, recomputed, "first run with tiers vs recompute");
    for (size_t i = 0; i < fillers.size(); ++i) Generate(*tiered.engine, absl::StrCat("f", i), fillers[i], 4);
    const EngineStats before = tiered.engine->stats();
    EXPECT_GT(before.host_tier.blocks_offloaded, 0);
    const Generation from_host = Generate(*tiered.engine, "p3", prompt, 12);
    const EngineStats after = tiered.engine->stats();
    EXPECT_GE(after.prefix_cache_host_hit_tokens - before.prefix_cache_host_hit_tokens, 6 * kBlock)
        << "the prompt's 6 full blocks should come back from the host tier";
    ExpectIdentical(from_host, recomputed, "host-tier prefix vs recompute");
  }
  // Write-through: blocks reach the host tier as tier 0 caches them, before any eviction.
  {
    EngineKvTierOptions write_through{.host_cache_bytes = 64 * slot_bytes, .write_through = true};
    Worker tiered = MakeWorker(16, write_through);
    const Generation first = Generate(*tiered.engine, "p", prompt, 12);
    ExpectIdentical(first, recomputed, "first run with write-through vs recompute");
    EXPECT_GE(tiered.engine->stats().host_tier.blocks_offloaded, 6) << "cached blocks are copied down at once";
    for (size_t i = 0; i < fillers.size(); ++i) Generate(*tiered.engine, absl::StrCat("f", i), fillers[i], 4);
    const EngineStats before = tiered.engine->stats();
    const Generation from_host = Generate(*tiered.engine, "p3", prompt, 12);
    EXPECT_GE(tiered.engine->stats().prefix_cache_host_hit_tokens - before.prefix_cache_host_hit_tokens, 6 * kBlock);
    ExpectIdentical(from_host, recomputed, "write-through host-tier prefix vs recompute");
  }
  // Disk: a restart with a fresh host tier; the disk tier's index is rebuilt from its files.
  {
    Worker restarted = MakeWorker(16, tiers);
    EXPECT_GT(restarted.engine->stats().disk_tier_records, 0);
    const Generation from_disk = Generate(*restarted.engine, "p4", prompt, 12);
    const EngineStats s = restarted.engine->stats();
    EXPECT_GT(s.num_waiting_for_disk, 0) << "the prefix should have been read from disk";
    EXPECT_GT(s.disk_tier.blocks_onboarded + s.host_tier.blocks_onboarded, 0);
    ExpectIdentical(from_disk, recomputed, "disk-tier prefix vs recompute");
  }
  // A corrupted disk: every payload byte flipped somewhere in each slab file.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const int64_t size = f.tellg();
    for (int64_t off = 4096 + 100; off < size; off += 4096) {
      f.seekg(off);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(off);
      f.write(&c, 1);
    }
  }
  {
    Worker corrupt = MakeWorker(16, tiers);
    const Generation run = Generate(*corrupt.engine, "p5", prompt, 12);
    ExpectIdentical(run, recomputed, "corrupted disk vs recompute");
    const EngineStats s = corrupt.engine->stats();
    EXPECT_GT(s.disk_tier.checksum_failures + s.disk_tier.skipped_records, 0);
  }
  std::filesystem::remove_all(dir);
}

// The multi-turn benchmark's losses, end to end: three waiting requests whose prefixes
// are on disk only, under a host tier whose load-hold share (6 of 12 slots) takes one
// prefix at a time. The first loads; the others wait for room (holding nothing) rather
// than load a part and recompute the rest; nothing read is lost before use, and every
// output is the recomputed one, bit for bit.
// Two workers over one shared connector below their host tiers (a stand-in for the
// cluster kv-store, in memory): what worker A computed and saved through, worker B
// loads instead of recomputing, bit-identically, also when the connector first answers
// "still finding out" (the request waits in the one waiting-for-KV state), and a block
// whose load fails is recomputed, never served.
TEST_P(EngineTiersTest, PrefixSavedByOneWorkerIsLoadedByAnotherThroughAConnector) {
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);  // 6 full blocks + 4 tokens
  Worker plain = MakeWorker(64, {});
  const Generation recomputed = Generate(*plain.engine, "p", prompt, 12);

  kv::InMemoryBlocks shared;
  auto tiers_over_shared = [&] { return TiersOver(shared, plain.runner->kv_swap_bytes_per_block()); };
  {
    Worker a = MakeWorker(64, tiers_over_shared());
    ExpectIdentical(Generate(*a.engine, "p", prompt, 12), recomputed, "worker A vs recompute");
  }
  ASSERT_GE(shared.saves, 6) << "worker A saves its full prompt blocks through";

  shared.pending_matches = 3;  // B's first lookups find the connector still asking
  Worker b = MakeWorker(64, tiers_over_shared());
  const Generation loaded = Generate(*b.engine, "p", prompt, 12);
  ExpectIdentical(loaded, recomputed, "worker B, prefix from worker A, vs recompute");
  EXPECT_GE(shared.loads, 6);
  const EngineStats s = b.engine->stats();
  EXPECT_GE(s.prefix_cache_host_hit_tokens, 6 * kBlock) << "B onboards A's blocks instead of recomputing them";
  EXPECT_GT(s.tiers.lookups_pending, 0);
  EXPECT_EQ(s.num_kv_blocks_stranded, 0);

  // A load that fails is recomputed: same output, the block not served.
  shared.loads = 0;
  shared.fail_loads.insert(shared.blocks.begin()->first);
  Worker c = MakeWorker(64, tiers_over_shared());
  ExpectIdentical(Generate(*c.engine, "p", prompt, 12), recomputed, "worker C with one failed load vs recompute");
  EXPECT_EQ(c.engine->stats().num_kv_blocks_stranded, 0);
}

// A request waiting for a connector's lookup is not looked up again every step (each
// lookup walks every tier): only once a lookup was answered, or after a recheck period.
TEST_P(EngineTiersTest, AWaitingRequestIsLookedUpAgainOnlyOnceALookupWasAnswered) {
  std::mt19937 rng(13);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);
  Worker plain = MakeWorker(64, {});
  const Generation recomputed = Generate(*plain.engine, "p", prompt, 8);
  kv::InMemoryBlocks shared;
  auto tiers_over_shared = [&] { return TiersOver(shared, plain.runner->kv_swap_bytes_per_block()); };
  {
    Worker a = MakeWorker(64, tiers_over_shared());
    ExpectIdentical(Generate(*a.engine, "p", prompt, 8), recomputed, "worker A vs recompute");
  }
  shared.pending_matches = 1'000'000;  // the store is slow to answer ...
  shared.hold_answers = true;          // ... and no answer comes
  shared.matches = 0;
  Worker b = MakeWorker(64, tiers_over_shared());
  EngineRequest r;
  r.request_id = "p";
  r.prompt_token_ids = prompt;
  r.sampling_params.max_tokens = 8;
  r.sampling_params.temperature = 0;
  std::vector<int32_t> tokens;
  r.on_output = [&tokens](const RequestOutput& out) {
    for (const CompletionOutput& c : out.outputs) tokens.insert(tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
  };
  ASSERT_TRUE(b.engine->AddRequest(std::move(r)).ok());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(b.engine->Step().ok());
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  // One lookup, then one per 50 ms recheck at most: not one per step.
  EXPECT_LE(shared.matches, 2 + waited_ms / 50) << "over 200 steps in " << waited_ms << " ms";
  EXPECT_TRUE(tokens.empty()) << "it waits for the lookup";
  // The answer comes: the next step looks again, loads and finishes as a recompute would.
  shared.pending_matches = 0;
  ++shared.lookups_answered;
  for (int i = 0; i < 200 && b.engine->HasUnfinishedRequests(); ++i) ASSERT_TRUE(b.engine->Step().ok());
  EXPECT_EQ(tokens, recomputed.tokens);
  EXPECT_GE(shared.loads, 6) << "the prefix was loaded, not recomputed";
}

TEST_P(EngineTiersTest, WaitingLoadsShareTheHostTierWithoutLosingWhatTheyRead) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(RandomPrompt(rng, 100));  // 6 full blocks + 4 tokens each
  std::vector<std::vector<int32_t>> fillers;
  for (int i = 0; i < 2; ++i) fillers.push_back(RandomPrompt(rng, 180));
  Worker plain = MakeWorker(64, {});
  std::vector<Generation> recomputed;
  for (size_t i = 0; i < prompts.size(); ++i) {
    recomputed.push_back(Generate(*plain.engine, absl::StrCat("ref", i), prompts[i], 6));
  }
  const std::string dir = TempDir(GetParam() + "_holds");
  const int64_t slot_bytes = plain.runner->kv_swap_bytes_per_block();
  {
    // Put the prompts on disk: computed, evicted by the fillers, offloaded and written through.
    Worker writer = MakeWorker(16, {.host_cache_bytes = 64 * slot_bytes, .disk_cache_dir = dir,
                                    .disk_cache_bytes = 256 * slot_bytes});
    for (size_t i = 0; i < prompts.size(); ++i) Generate(*writer.engine, absl::StrCat("w", i), prompts[i], 1);
    for (size_t i = 0; i < fillers.size(); ++i) Generate(*writer.engine, absl::StrCat("f", i), fillers[i], 1);
  }
  Worker restarted = MakeWorker(16, {.host_cache_bytes = 12 * slot_bytes, .disk_cache_dir = dir,
                                     .disk_cache_bytes = 256 * slot_bytes});
  ASSERT_GE(restarted.engine->stats().disk_tier_records, 18);
  Engine& engine = *restarted.engine;
  std::map<std::string, Generation> got;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("p", i);
    r.prompt_token_ids = prompts[i];
    r.sampling_params = testing_util::GreedyWithLogprobs(6);
    ASSERT_TRUE(engine.AddRequest(std::move(r)).ok());
  }
  for (int step = 0; step < 4000 && engine.HasUnfinishedRequests(); ++step) {
    auto outputs = engine.Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    for (const RequestOutput& out : *outputs) {
      for (const CompletionOutput& c : out.outputs) {
        Generation& g = got[out.request_id];
        g.tokens.insert(g.tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
        g.samples.insert(g.samples.end(), c.new_logprobs.begin(), c.new_logprobs.end());
      }
    }
    ASSERT_TRUE(engine.kv_cache().CheckInvariants().ok()) << engine.kv_cache().CheckInvariants();
    ASSERT_EQ(engine.stats().num_kv_blocks_stranded, 0) << "step " << step;
    if (engine.stats().num_running_seqs == 0) usleep(1000);  // disk reads land asynchronously
  }
  ASSERT_FALSE(engine.HasUnfinishedRequests());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ExpectIdentical(got[absl::StrCat("p", i)], recomputed[i], absl::StrCat("prompt ", i, " after waiting for room"));
  }
  const EngineStats s = engine.stats();
  EXPECT_GE(s.num_disk_loads_deferred, 2) << "two loads should have waited for the first one's hold";
  EXPECT_GE(s.num_waiting_for_disk, 3) << "every prompt should have been loaded from disk in the end";
  EXPECT_EQ(s.num_disk_blocks_lost, 0) << "a held load is never lost before use";
  EXPECT_EQ(s.tiers.load_blocks_cut, 0);
  EXPECT_GE(s.prefix_cache_host_hit_tokens, 3 * 6 * kBlock);
  std::filesystem::remove_all(dir);
}

TEST_P(EngineTiersTest, RandomizedSoakKeepsInvariantsAndStrandsNothing) {
  std::mt19937 rng(99);
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(RandomPrompt(rng, 48 + 16 * i));
  const std::string dir = TempDir(GetParam() + "_soak");
  Worker probe = MakeWorker(8, {});
  const int64_t slot_bytes = probe.runner->kv_swap_bytes_per_block();
  const EngineKvTierOptions tiers{.host_cache_bytes = 10 * slot_bytes, .disk_cache_dir = dir,
                                  .disk_cache_bytes = 40 * slot_bytes};
  auto worker = std::make_unique<Worker>(MakeWorker(14, tiers));
  int64_t next_id = 0;
  int64_t operations = 0;
  std::vector<std::string> live;
  for (int step = 0; step < 2500; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 19)(rng);
    if (op < 6 && live.size() < 6) {
      EngineRequest r;
      r.request_id = absl::StrCat("r", next_id++);
      r.prompt_token_ids = prefixes[std::uniform_int_distribution<size_t>(0, prefixes.size() - 1)(rng)];
      const std::vector<int32_t> own = RandomPrompt(rng, std::uniform_int_distribution<int>(1, 30)(rng));
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), own.begin(), own.end());
      r.sampling_params = testing_util::GreedyWithLogprobs(std::uniform_int_distribution<int>(1, 20)(rng));
      ASSERT_TRUE(worker->engine->AddRequest(r).ok());
      live.push_back(r.request_id);
      ++operations;
    } else if (op == 6 && !live.empty()) {
      const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      (void)worker->engine->Abort(live[i]);  // may have finished already
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      ++operations;
    } else if (op == 7 && step % 250 == 7) {
      // Restart the worker (its disk tier survives): abort what runs, then rebuild.
      for (const std::string& id : live) (void)worker->engine->Abort(id);
      live.clear();
      worker.reset();
      worker = std::make_unique<Worker>(MakeWorker(14, tiers));
      ++operations;
    }
    auto outputs = worker->engine->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    for (const RequestOutput& out : *outputs) {
      if (out.finished) std::erase(live, out.request_id);
    }
    ++operations;
    ASSERT_TRUE(worker->engine->kv_cache().CheckInvariants().ok()) << worker->engine->kv_cache().CheckInvariants();
    ASSERT_TRUE(worker->engine->scheduler().CheckInvariants().ok());
    ASSERT_EQ(worker->engine->stats().num_kv_blocks_stranded, 0) << "step " << step;
  }
  for (const std::string& id : live) (void)worker->engine->Abort(id);
  const EngineStats s = worker->engine->stats();
  EXPECT_EQ(s.num_kv_blocks_used, 0);
  EXPECT_EQ(s.num_kv_blocks_stranded, 0);
  std::printf("soak: %lld operations; host offloaded %lld onboarded %lld; disk records %lld, preemptions %lld\n",
              static_cast<long long>(operations), static_cast<long long>(s.host_tier.blocks_offloaded),
              static_cast<long long>(s.host_tier.blocks_onboarded), static_cast<long long>(s.disk_tier_records),
              static_cast<long long>(s.num_preemptions));
  EXPECT_GT(s.host_tier.blocks_offloaded + s.host_tier.blocks_onboarded, 0);
  worker.reset();
  std::filesystem::remove_all(dir);
}

TEST_P(EngineTiersTest, BadTierConfigurationIsAClearError) {
  const auto create = [&](EngineKvTierOptions tiers, bool prefix_caching = true) {
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = kBlock, .num_blocks = 8});
    EXPECT_TRUE(runner.ok());
    EngineOptions options;
    options.kv.block_size_tokens = kBlock;
    options.kv.enable_prefix_caching = prefix_caching;
    options.max_model_len = 128;
    options.tiers = std::move(tiers);
    return Engine::Create(options, **runner).status();
  };
  absl::Status s = create({.host_cache_bytes = 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--kv-host-cache-bytes"), std::string::npos) << s;
  s = create({.disk_cache_dir = "/tmp"});
  EXPECT_NE(s.message().find("--kv-disk-cache-dir"), std::string::npos) << s;
  s = create({.host_cache_bytes = int64_t{1} << 24}, /*prefix_caching=*/false);
  EXPECT_NE(s.message().find("prefix caching"), std::string::npos) << s;
  if (geteuid() != 0) {  // root writes anywhere
    s = create({.host_cache_bytes = int64_t{1} << 24, .disk_cache_dir = "/proc/kvmesh", .disk_cache_bytes = 1 << 30});
    EXPECT_NE(s.message().find("--kv-disk-cache-dir"), std::string::npos) << s;
  }
  s = create({.host_cache_bytes = int64_t{1} << 24, .disk_cache_dir = "/proc/kvmesh_no", .disk_cache_bytes = 1 << 30});
  EXPECT_NE(s.message().find("--kv-disk-cache-dir"), std::string::npos) << s;
}

// Under tensor parallelism (two CPU ranks over Gloo) every rank copies its own heads into
// its share of a slot: a prefix from the host tier or, after a restart, from the disk
// tier gives the same bits as the same group recomputing it.
TEST_P(EngineTiersTest, TensorParallelRanksOffloadAndOnboardTheirOwnHeads) {
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);
  std::vector<std::vector<int32_t>> fillers;
  for (int i = 0; i < 3; ++i) fillers.push_back(RandomPrompt(rng, 180));
  auto make = [&](int32_t num_blocks, EngineKvTierOptions tiers, std::unique_ptr<TensorParallelRunner>* runner) {
    auto r = TensorParallelRunner::Create(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(),
                                          {.tensor_parallel_size = 2, .block_size_tokens = kBlock,
                                           .num_blocks = num_blocks, .total_threads = 2});
    EXPECT_TRUE(r.ok()) << r.status();
    *runner = std::move(r).value();
    return MakeEngine(**runner, std::move(tiers));
  };
  std::unique_ptr<TensorParallelRunner> plain_runner;
  std::unique_ptr<Engine> plain = make(64, {}, &plain_runner);
  const Generation recomputed = Generate(*plain, "p", prompt, 12);
  const int64_t slot_bytes = plain_runner->kv_swap_bytes_per_block();
  ASSERT_GT(slot_bytes, 0);
  EXPECT_EQ(plain_runner->kv_slot_shape().num_layers % 2, 0) << "both ranks' layers";
  const std::string dir = TempDir(GetParam() + "_tp2");
  EngineKvTierOptions tiers{.host_cache_bytes = 64 * slot_bytes, .disk_cache_dir = dir,
                            .disk_cache_bytes = 256 * slot_bytes};
  {
    std::unique_ptr<TensorParallelRunner> runner;
    std::unique_ptr<Engine> engine = make(16, tiers, &runner);
    ExpectIdentical(Generate(*engine, "p", prompt, 12), recomputed, "TP=2 first run with tiers");
    for (size_t i = 0; i < fillers.size(); ++i) Generate(*engine, absl::StrCat("f", i), fillers[i], 4);
    const int64_t before = engine->stats().prefix_cache_host_hit_tokens;
    ExpectIdentical(Generate(*engine, "p3", prompt, 12), recomputed, "TP=2 host-tier prefix");
    EXPECT_GE(engine->stats().prefix_cache_host_hit_tokens - before, 6 * kBlock);
  }
  {
    std::unique_ptr<TensorParallelRunner> runner;
    std::unique_ptr<Engine> engine = make(16, tiers, &runner);
    EXPECT_GT(engine->stats().disk_tier_records, 0);
    ExpectIdentical(Generate(*engine, "p4", prompt, 12), recomputed, "TP=2 disk-tier prefix after a restart");
    EXPECT_GT(engine->stats().num_waiting_for_disk, 0) << "the prefix should have been read from disk";
  }
  std::filesystem::remove_all(dir);
}

// Host memory the test can reach: the tier's allocator hook (a CUDA worker's pinned
// allocator in production) records where the slots are, so the test can corrupt them.
struct ReachableHostMemory {
  std::byte* memory = nullptr;
  int64_t bytes = 0;
  void Corrupt(int64_t slot_bytes) const {
    for (int64_t off = slot_bytes / 2; off < bytes; off += slot_bytes) memory[off] ^= std::byte{0x5a};
  }
};

EngineKvTierOptions ReachableHostTier(int64_t bytes, std::shared_ptr<ReachableHostMemory> where) {
  return EngineKvTierOptions{.host_cache_bytes = bytes,
                             .host_allocate =
                                 [where](int64_t n) {
                                   where->memory = static_cast<std::byte*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
                                   where->bytes = n;
                                   return where->memory;
                                 },
                             .host_deallocate = [](std::byte* p) { std::free(p); }};
}

// A host-tier block whose bytes changed after they were offloaded is never served: on
// the CPU runner the copy that brings it back hashes it and the step stops before any
// chunk reads it (its sequences run again and recompute the block); a TP runner's ranks
// copy only their share, so there the lookup verifies the whole slot first. Either way
// the output equals a recompute's, the failure is counted, and nothing is stranded.
TEST_P(EngineTiersTest, ACorruptHostBlockIsRecomputedNeverServed) {
  std::mt19937 rng(13);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);
  const std::vector<int32_t> other = RandomPrompt(rng, 40);  // runs beside it in the corrupt step
  std::vector<std::vector<int32_t>> fillers;
  for (int i = 0; i < 3; ++i) fillers.push_back(RandomPrompt(rng, 180));
  Worker plain = MakeWorker(64, {});
  const Generation recomputed = Generate(*plain.engine, "p", prompt, 12);
  const Generation other_alone = Generate(*plain.engine, "o", other, 12);
  const int64_t slot_bytes = plain.runner->kv_swap_bytes_per_block();

  auto host = std::make_shared<ReachableHostMemory>();
  Worker tiered = MakeWorker(16, ReachableHostTier(64 * slot_bytes, host));
  ASSERT_TRUE(tiered.runner->verifies_swap_ins());
  Generate(*tiered.engine, "p", prompt, 12);
  for (size_t i = 0; i < fillers.size(); ++i) Generate(*tiered.engine, absl::StrCat("f", i), fillers[i], 4);
  ASSERT_GE(tiered.engine->stats().host_tier.blocks_offloaded, 6);
  ASSERT_NE(host->memory, nullptr);
  host->Corrupt(slot_bytes);
  // Both in one step: the corrupt onboard must not cost the other request its output.
  std::map<std::string, Generation> runs =
      testing_util::GenerateTogether(*tiered.engine, {{"p2", prompt}, {"o2", other}}, 12);
  ExpectIdentical(runs["p2"], recomputed, "corrupt host tier vs recompute");
  ExpectIdentical(runs["o2"], other_alone, "the request beside it");
  const EngineStats s = tiered.engine->stats();
  EXPECT_GT(s.host_tier.checksum_failures, 0);
  EXPECT_GT(s.num_swap_in_retries, 0) << "the copy, not the lookup, caught it";
  EXPECT_EQ(s.num_kv_blocks_stranded, 0);
  EXPECT_TRUE(tiered.engine->kv_cache().CheckInvariants().ok()) << tiered.engine->kv_cache().CheckInvariants();
  // And again: the dropped blocks are not found a second time.
  const int64_t failures = s.host_tier.checksum_failures;
  ExpectIdentical(Generate(*tiered.engine, "p3", prompt, 12), recomputed, "after the corrupt blocks were dropped");
  EXPECT_EQ(tiered.engine->stats().host_tier.checksum_failures, failures);

  // Tensor parallel (its own reference: TP=2 sums in another order): verified at lookup.
  auto make_tp = [&](int32_t num_blocks) {
    auto tp = TensorParallelRunner::Create(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(),
                                           {.tensor_parallel_size = 2, .block_size_tokens = kBlock,
                                            .num_blocks = num_blocks, .total_threads = 2});
    EXPECT_TRUE(tp.ok()) << tp.status();
    return tp.ok() ? std::move(tp).value() : nullptr;
  };
  std::unique_ptr<TensorParallelRunner> tp_plain_runner = make_tp(64);
  ASSERT_NE(tp_plain_runner, nullptr);
  const Generation tp_recomputed = Generate(*MakeEngine(*tp_plain_runner, {}), "p", prompt, 12);
  std::unique_ptr<TensorParallelRunner> tp = make_tp(16);
  ASSERT_NE(tp, nullptr);
  EXPECT_FALSE(tp->verifies_swap_ins());
  auto tp_host = std::make_shared<ReachableHostMemory>();
  const int64_t tp_slot_bytes = tp->kv_swap_bytes_per_block();
  std::unique_ptr<Engine> tp_engine = MakeEngine(*tp, ReachableHostTier(64 * tp_slot_bytes, tp_host));
  Generate(*tp_engine, "p", prompt, 12);
  for (size_t i = 0; i < fillers.size(); ++i) Generate(*tp_engine, absl::StrCat("f", i), fillers[i], 4);
  tp_host->Corrupt(tp_slot_bytes);
  ExpectIdentical(Generate(*tp_engine, "p2", prompt, 12), tp_recomputed, "TP=2, corrupt host tier vs recompute");
  EXPECT_GT(tp_engine->stats().host_tier.checksum_failures, 0);
  EXPECT_EQ(tp_engine->stats().num_swap_in_retries, 0);
  EXPECT_EQ(tp_engine->stats().num_kv_blocks_stranded, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineTiersTest, ::testing::Values("tiny-llama", "llama-f32"),
                         [](const auto& info) { return info.param == "tiny-llama" ? "bf16_tiny" : "f32"; });

}  // namespace
}  // namespace kvmesh::engine
