// The real kvmesh-kv-store on 127.0.0.1, driven by KvStoreClient with SmolLM2-shaped
// blocks (one TP rank's shard of a 16-token block, every layer): blocks come back bit
// for bit; a restart is a new epoch that the client notices and acts on; a stopped
// (SIGSTOP) store is a miss within the deadline; a store killed mid-get is a miss, not a
// crash; a request with another cache_salt never hits; of two stores, the survivor's
// share still hits when the other is killed.
#include <signal.h>

#include <atomic>
#include <cstring>
#include <span>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "child_process.h"
#include "smollm2_store_block.h"
#include "core/dtype.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/store_key.h"
#include "kv_store/store_ring.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kBlockBytes = kSmolLm2BlockBytes;
constexpr int64_t kCapacityBlocks = 1024;

class StoreProcess {
 public:
  // port 0: a free one (kept for restarts).
  void Start(int port = 0) {
    process_.Start({KVMESH_KV_STORE_BIN, absl::StrCat("--listen=127.0.0.1:", port),
                    absl::StrCat("--block_bytes=", kBlockBytes), absl::StrCat("--capacity_blocks=", kCapacityBlocks),
                    "--metrics_port=-1", "--shutdown_grace_ms=1000"},
                   "kv-store listening");
    port_ = process_.port();
  }
  void Restart() { Start(port_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  testing::ChildProcess& process() { return process_; }

 private:
  testing::ChildProcess process_;
  int port_ = 0;
};

std::vector<kv::BlockHash> Chain(int n, uint64_t prompt) {
  std::vector<kv::BlockHash> chain;
  for (int i = 0; i < n; ++i) chain.push_back({.low = static_cast<uint64_t>(i), .high = prompt});
  return chain;
}

std::vector<std::vector<std::byte>> Blocks(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> blocks(n, std::vector<std::byte>(kBlockBytes));
  for (auto& b : blocks) {
    for (size_t i = 0; i < b.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(b.data() + i, &v, 8);
    }
  }
  return blocks;
}

std::vector<std::span<const std::byte>> ConstSpans(const std::vector<std::vector<std::byte>>& blocks) {
  return {blocks.begin(), blocks.end()};
}
std::vector<std::span<std::byte>> Spans(std::vector<std::vector<std::byte>>& blocks) {
  return {blocks.begin(), blocks.end()};
}
std::vector<std::vector<std::byte>> Zeros(int n) {
  return std::vector<std::vector<std::byte>>(n, std::vector<std::byte>(kBlockBytes));
}

absl::Time Deadline(int64_t ms = 10'000) { return absl::Now() + absl::Milliseconds(ms); }

StoreKeySpace Space(std::string cache_salt = "") {
  return StoreKeySpace::Create({.model = "smollm2-135m", .block_spec = kSmolLm2Block, .cache_salt = cache_salt})
      .value();
}

class KvStoreIntegrationTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvStoreClient> Client(std::vector<std::string> addresses) {
    return KvStoreClient::Create({.addresses = std::move(addresses), .warmup_ms = 0}).value();
  }
  // Lookups until `client` has heard a new epoch from store `i` (its channel may first
  // have to reconnect after the restart).
  static void AwaitNewEpoch(KvStoreClient& client, int i, uint64_t old_epoch, const StoreKey& probe) {
    for (int attempt = 0; attempt < 100 && client.epoch(i) == old_epoch; ++attempt) {
      KvStoreLookup lookup = client.Lookup({{probe}}, Deadline(1000));
      client.Release(lookup, Deadline(1000));
      if (client.epoch(i) == old_epoch) absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_NE(client.epoch(i), old_epoch) << "the client never saw the restarted store's epoch";
  }
};

TEST_F(KvStoreIntegrationTest, PutsAndGetsSmolLm2BlocksBitIdentically) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start());
  auto client = Client({store.address()});
  const std::vector<StoreKey> keys = Space().Keys(Chain(64, 1));
  const auto blocks = Blocks(64, 1);
  const KvStorePutResult put = client->Put(keys, ConstSpans(blocks), {}, Deadline());
  ASSERT_TRUE(put.error.ok()) << put.error;
  ASSERT_EQ(put.num_committed, 64);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, 64) << lookup.error;
  auto out = Zeros(64);
  const KvStoreGetResult got = client->Get(lookup, Spans(out), Deadline());
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.num_loaded, 64);
  EXPECT_TRUE(out == blocks) << "a block came back different";
  EXPECT_EQ(client->stats().checksum_failures, 0);
  EXPECT_EQ(store.process().Stop(), 0) << "no clean exit on SIGTERM; log:\n" << store.process().log();
  EXPECT_NE(store.process().log().find("kv-store stopped"), std::string::npos);
}

// Fails if epochs are ignored: a client that did not forget what the store held before
// its restart would skip the put of the second block (it "knows" the store has it), and
// the last lookup would miss.
TEST_F(KvStoreIntegrationTest, ARestartIsANewEpochAndTheClientForgetsWhatTheStoreHeld) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start());
  auto client = Client({store.address()});
  const std::vector<StoreKey> keys = Space().Keys(Chain(2, 2));
  const auto blocks = Blocks(2, 2);
  ASSERT_EQ(client->Put(keys, ConstSpans(blocks), {}, Deadline()).num_committed, 2);
  const uint64_t before = client->epoch(0);
  ASSERT_NE(before, 0u);

  store.process().Signal(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(store.Restart());
  ASSERT_NO_FATAL_FAILURE(AwaitNewEpoch(*client, 0, before, keys[0]));
  EXPECT_EQ(client->stats().epoch_changes, 1);
  EXPECT_EQ(client->Lookup({{keys[0]}}, Deadline()).num_present, 0) << "the restarted store is empty";

  const KvStorePutResult put = client->Put({{keys[1]}}, {{blocks[1]}}, {}, Deadline());
  EXPECT_EQ(put.num_committed, 1) << "the client still believed the restarted store held the block";
  KvStoreLookup lookup = client->Lookup({{keys[1]}}, Deadline());
  ASSERT_EQ(lookup.num_present, 1);
  auto out = Zeros(1);
  ASSERT_EQ(client->Get(lookup, Spans(out), Deadline()).num_loaded, 1);
  EXPECT_TRUE(out[0] == blocks[1]);
}

TEST_F(KvStoreIntegrationTest, AStoppedStoreIsAMissWithinTheDeadline) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start());
  auto client = Client({store.address()});
  const std::vector<StoreKey> keys = Space().Keys(Chain(8, 3));
  const auto blocks = Blocks(8, 3);
  ASSERT_EQ(client->Put(keys, ConstSpans(blocks), {}, Deadline()).num_committed, 8);
  KvStoreLookup before_stop = client->Lookup(keys, Deadline());
  ASSERT_EQ(before_stop.num_present, 8);

  store.process().Signal(SIGSTOP);
  const absl::Duration kDeadline = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  const KvStoreLookup lookup = client->Lookup(keys, start + kDeadline);
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(lookup.num_present, 0);
  EXPECT_FALSE(lookup.error.ok());
  EXPECT_LT(took, kDeadline + absl::Milliseconds(200)) << "the lookup outlived its deadline";

  auto out = Zeros(8);
  start = absl::Now();
  const KvStoreGetResult got = client->Get(before_stop, Spans(out), start + kDeadline);
  took = absl::Now() - start;
  EXPECT_EQ(got.num_loaded, 0);
  EXPECT_EQ(got.error.code(), absl::StatusCode::kDeadlineExceeded) << got.error;
  EXPECT_LT(took, kDeadline + absl::Milliseconds(200)) << "the get outlived its deadline";

  const KvStorePutResult put = client->Put(Space().Keys(Chain(2, 30)), {{blocks[0], blocks[1]}}, {},
                                           absl::Now() + kDeadline);
  EXPECT_EQ(put.num_committed, 0);
  EXPECT_FALSE(put.error.ok());

  store.process().Signal(SIGCONT);
  EXPECT_EQ(client->Lookup(keys, Deadline()).num_present, 8) << "a resumed store serves again (same epoch)";
}

TEST_F(KvStoreIntegrationTest, AStoreKilledMidGetIsAMissNotACrash) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start());
  auto client = Client({store.address()});
  constexpr int kBlocks = 1000;  // ~350 MiB: long enough a stream to be cut
  const std::vector<StoreKey> keys = Space().Keys(Chain(kBlocks, 4));
  const auto blocks = Blocks(kBlocks, 4);
  const std::vector<std::span<const std::byte>> all = ConstSpans(blocks);
  for (size_t first = 0; first < kBlocks; first += 100) {
    const KvStorePutResult put = client->Put(std::span(keys).subspan(first, 100),
                                             std::span(all).subspan(first, 100), {}, Deadline());
    ASSERT_EQ(put.num_committed, 100) << put.error;
  }
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, kBlocks);

  auto out = Zeros(kBlocks);
  std::atomic<bool> done{false};
  KvStoreGetResult got;
  const absl::Time start = absl::Now();
  std::thread get([&] {
    got = client->Get(lookup, Spans(out), Deadline(20'000));
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(30));
  const bool killed_mid_get = !done.load();
  store.process().Signal(SIGKILL);
  get.join();
  EXPECT_TRUE(killed_mid_get) << "the get finished before the kill; make it longer";
  EXPECT_LT(got.num_loaded, kBlocks);
  EXPECT_FALSE(got.error.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int i = 0; i < got.num_loaded; ++i) ASSERT_TRUE(out[i] == blocks[i]) << "block " << i;
  EXPECT_EQ(client->stats().checksum_failures, 0);
  // And afterwards: misses, not errors.
  EXPECT_EQ(client->Lookup(keys, Deadline(1000)).num_present, 0);
}

TEST_F(KvStoreIntegrationTest, ARequestWithAnotherCacheSaltNeverHits) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start());
  auto client = Client({store.address()});
  const std::vector<kv::BlockHash> chain = Chain(16, 5);
  const auto blocks = Blocks(16, 5);
  ASSERT_EQ(client->Put(Space("tenant-a").Keys(chain), ConstSpans(blocks), {}, Deadline()).num_committed, 16);
  EXPECT_EQ(client->Lookup(Space("tenant-a").Keys(chain), Deadline()).num_present, 16);
  for (const char* other : {"tenant-b", "", "tenant-a "}) {
    EXPECT_EQ(client->Lookup(Space(other).Keys(chain), Deadline()).num_present, 0) << "salt '" << other << "'";
  }
}

TEST_F(KvStoreIntegrationTest, OfTwoStoresTheSurvivorsShareStillHits) {
  StoreProcess a;
  StoreProcess b;
  ASSERT_NO_FATAL_FAILURE(a.Start());
  ASSERT_NO_FATAL_FAILURE(b.Start());
  auto client = Client({a.address(), b.address()});
  const std::vector<StoreKey> keys = Space().Keys(Chain(64, 6));
  const auto blocks = Blocks(64, 6);
  ASSERT_EQ(client->Put(keys, ConstSpans(blocks), {}, Deadline()).num_committed, 64);
  b.process().Signal(SIGKILL);
  const StoreRing ring({a.address(), b.address()}, absl::ZeroDuration());
  int hits = 0;
  int on_a = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    KvStoreLookup one = client->Lookup({{keys[i]}}, Deadline(2000));
    if (one.num_present == 1) {
      auto out = Zeros(1);
      ASSERT_EQ(client->Get(one, Spans(out), Deadline(2000)).num_loaded, 1);
      EXPECT_TRUE(out[0] == blocks[i]);
      ++hits;
    }
    on_a += ring.Home(keys[i]) == 0;
  }
  EXPECT_GT(on_a, 16);
  EXPECT_LT(on_a, 48);
  EXPECT_EQ(hits, on_a) << "every key homed on the survivor hits, none of the dead store's";
}

}  // namespace
}  // namespace kvmesh::kv_store
