// The scheduler's mirror of the cluster kv-store (StoreResidencyPoller over the real
// kvmesh-kv-store on 127.0.0.1): blocks a worker puts become store hits in placement for
// every worker registered with the key space; a restarted store (a new epoch) and a
// killed one stop counting; eviction reaches the mirror as removals.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "child_process.h"
#include "cluster/worker_registry.h"
#include "kv/block_hash.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/store_key.h"
#include "metrics/registry.h"
#include "store_residency_poller.h"

namespace kvmesh::scheduler {
namespace {

constexpr int64_t kBlockBytes = 4096;
constexpr int32_t kBlockTokens = 16;

class StoreProcess {
 public:
  void Start(int port = 0, int64_t capacity_blocks = 64) {
    process_.Start({KVMESH_KV_STORE_BIN, absl::StrCat("--listen=127.0.0.1:", port),
                    absl::StrCat("--block_bytes=", kBlockBytes), absl::StrCat("--capacity_blocks=", capacity_blocks),
                    "--metrics_port=-1", "--shutdown_grace_ms=1000"},
                   "kv-store listening");
    port_ = process_.port();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  testing::ChildProcess& process() { return process_; }

 private:
  testing::ChildProcess process_;
  int port_ = 0;
};

kv_store::StoreKeySpace KeySpace() {
  return kv_store::StoreKeySpace::Create({.model = "m",
                                          .block_spec = {.num_layers = 2,
                                                         .num_kv_heads = 2,
                                                         .head_dim = 8,
                                                         .block_size_tokens = kBlockTokens,
                                                         .dtype = DType::kBF16,
                                                         .block_bytes = kBlockBytes / 2},
                                          .tp_rank = 0,
                                          .tp_size = 1})
      .value();
}

std::vector<kv::BlockHash> PromptHashes(int32_t num_blocks, int32_t first_token) {
  std::vector<int32_t> tokens(static_cast<size_t>(num_blocks) * kBlockTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + static_cast<int32_t>(i);
  return kv::HashFullBlocks(tokens, kBlockTokens, 0);
}

// Puts the prompt's blocks as a worker's connector would.
void PutPrompt(const std::string& address, const kv_store::StoreKeySpace& keys,
               const std::vector<kv::BlockHash>& hashes) {
  std::unique_ptr<kv_store::KvStoreClient> client =
      kv_store::KvStoreClient::Create({.addresses = {address}, .warmup_ms = 0}).value();
  std::vector<std::vector<std::byte>> blocks(hashes.size(), std::vector<std::byte>(kBlockBytes, std::byte{7}));
  std::vector<std::span<const std::byte>> spans(blocks.begin(), blocks.end());
  const kv_store::KvStorePutResult put =
      client->Put(keys.Keys(hashes), spans, {}, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(put.num_committed + put.num_present, static_cast<int32_t>(hashes.size())) << put.error;
}

class StoreResidencyIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_.Start();
    cluster::WorkerRegistration worker{
        .worker_id = "w-store",
        .address = "127.0.0.1:1",
        .role = cluster::WorkerRole::kBoth,
        .model = "m",
        .kv_cache_spec = {.block_size_tokens = kBlockTokens, .num_layers = 2, .num_kv_heads = 2, .head_dim = 8},
        .kv_store_key_spaces = {keys_.id()}};
    ASSERT_TRUE(registry_.Register(worker).ok());
    worker.worker_id = "w-plain";
    worker.address = "127.0.0.1:2";
    worker.kv_store_key_spaces.clear();
    ASSERT_TRUE(registry_.Register(worker).ok());
    poller_ = StoreResidencyPoller::Create({.addresses = {store_.address()},
                                            .poll_interval_ms = 50,
                                            .timeout_ms = 300,
                                            .forget_after_ms = 200},
                                           registry_, metrics_)
                  .value();
  }

  // Store blocks of the prompt per worker, in worker-id order (w-plain, w-store).
  std::vector<int32_t> StoreBlocks(const std::vector<kv::BlockHash>& hashes) {
    std::vector<int32_t> out;
    for (const cluster::WorkerCandidate& c : registry_.Candidates("m", hashes)) {
      out.push_back(c.prefix.num_blocks_by_tier[static_cast<int>(kv::Tier::kStore)]);
    }
    return out;
  }

  StoreProcess store_;
  const kv_store::StoreKeySpace keys_ = KeySpace();
  cluster::WorkerRegistry registry_{{.heartbeat_interval_ms = 1000, .worker_ttl_ms = 600'000}};
  metrics::Registry metrics_;
  std::unique_ptr<StoreResidencyPoller> poller_;
};

TEST_F(StoreResidencyIntegrationTest, PutBlocksBecomePlacementHitsForWorkersWithTheKeySpace) {
  const std::vector<kv::BlockHash> hashes = PromptHashes(8, 100);
  PutPrompt(store_.address(), keys_, hashes);
  poller_->PollOnce();
  EXPECT_EQ(StoreBlocks(hashes), (std::vector<int32_t>{0, 8}));
  EXPECT_EQ(registry_.num_store_blocks(store_.address()), 8);
  // More of the chain later: deltas extend the run.
  const std::vector<kv::BlockHash> longer = PromptHashes(12, 100);
  PutPrompt(store_.address(), keys_, longer);
  poller_->PollOnce();
  EXPECT_EQ(StoreBlocks(longer), (std::vector<int32_t>{0, 12}));
}

TEST_F(StoreResidencyIntegrationTest, EvictionsReachTheMirror) {
  store_.process().Stop();
  store_.Start(store_.port(), /*capacity_blocks=*/8);
  poller_->PollOnce();
  const std::vector<kv::BlockHash> first = PromptHashes(8, 100);
  PutPrompt(store_.address(), keys_, first);
  poller_->PollOnce();
  EXPECT_EQ(StoreBlocks(first)[1], 8);
  PutPrompt(store_.address(), keys_, PromptHashes(4, 9000));  // evicts 4 of the first prompt's blocks
  poller_->PollOnce();
  EXPECT_LT(StoreBlocks(first)[1], 8);
  EXPECT_EQ(registry_.num_store_blocks(store_.address()), 8);
}

TEST_F(StoreResidencyIntegrationTest, ARestartedStoreIsForgottenByItsNewEpoch) {
  const std::vector<kv::BlockHash> hashes = PromptHashes(8, 100);
  PutPrompt(store_.address(), keys_, hashes);
  poller_->PollOnce();
  ASSERT_EQ(StoreBlocks(hashes)[1], 8);
  // Restarted between two polls, faster than forget_after_ms: only the epoch tells.
  store_.process().Stop();
  store_.Start(store_.port());
  PutPrompt(store_.address(), keys_, PromptHashes(2, 100));  // the new life holds 2 of them
  poller_->PollOnce();
  EXPECT_EQ(StoreBlocks(hashes)[1], 2) << "the previous life's blocks still count: the epoch was ignored";
}

TEST_F(StoreResidencyIntegrationTest, ADeadStoreIsForgottenAfterThePatience) {
  const std::vector<kv::BlockHash> hashes = PromptHashes(8, 100);
  PutPrompt(store_.address(), keys_, hashes);
  poller_->PollOnce();
  ASSERT_EQ(StoreBlocks(hashes)[1], 8);
  store_.process().Signal(SIGKILL);
  poller_->PollOnce();  // the first failure: not yet
  EXPECT_EQ(StoreBlocks(hashes)[1], 8);
  absl::SleepFor(absl::Milliseconds(300));
  poller_->PollOnce();
  EXPECT_EQ(StoreBlocks(hashes)[1], 0);
  EXPECT_NE(metrics_.Exposition().find("kvmesh_scheduler_kv_store_forgotten_total 1"), std::string::npos)
      << metrics_.Exposition();
}

TEST_F(StoreResidencyIntegrationTest, AHungStoreCostsAtMostTheCallTimeout) {
  store_.process().Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  poller_->PollOnce();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  store_.process().Signal(SIGCONT);
}

}  // namespace
}  // namespace kvmesh::scheduler
