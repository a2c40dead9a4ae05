// KvStoreConnector (the cluster store as a worker's KvConnector) against a real
// KvStoreServer in this process (gRPC on 127.0.0.1), a listener that never answers (a
// hung store) and a closed port (a dead one): what one worker saves another loads bit
// for bit; a lookup is pending until the store answers or its deadline passes (a miss);
// a load the store can no longer serve completes with an error, never with bytes.
#include "kv_store/kv_store_connector.h"

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kv/block_hash.h"
#include "kv/checksum.h"
#include "kv_store_server/kv_store_server.h"
#include "store_test_util.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kBlockBytes = 2048;

KvStoreServerOptions StoreOptions(int port = 0) {
  KvStoreServerOptions o;
  o.listen_address = absl::StrCat("127.0.0.1:", port);
  o.store = {.capacity_blocks = 64, .slot_bytes = kBlockBytes};
  o.metrics_port = -1;
  return o;
}

StoreKeyScope Scope(int32_t tp_rank = 0) {
  return StoreKeyScope{.model = "m",
                       .block_spec = {.num_layers = 2, .num_kv_heads = 1, .head_dim = 8, .block_size_tokens = 16,
                                      .dtype = DType::kF32, .block_bytes = kBlockBytes / 2},
                       .tp_rank = tp_rank,
                       .tp_size = 2};
}

// A connector to the store at `address` with `options` (its block_bytes: kBlockBytes).
std::unique_ptr<KvStoreConnector> ConnectorWith(const std::string& address, KvStoreConnectorOptions options) {
  auto client = KvStoreClient::Create({.addresses = {address}, .warmup_ms = 0});
  EXPECT_TRUE(client.ok()) << client.status();
  options.block_bytes = kBlockBytes;
  auto c = KvStoreConnector::Create(std::move(client).value(), options);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::unique_ptr<KvStoreConnector> Connector(const std::string& address, StoreKeyScope scope = Scope(),
                                            int64_t lookup_timeout_ms = 2000) {
  return ConnectorWith(address, {.scope = std::move(scope), .lookup_timeout_ms = lookup_timeout_ms});
}

std::vector<kv::BlockHash> Chain(int n) {
  std::vector<kv::BlockHash> v;
  for (int i = 0; i < n; ++i) v.push_back(kv::BlockHash{.low = 70 + static_cast<uint64_t>(i), .high = 3});
  return v;
}

// Polls until `done` completions came (or 10 s passed).
std::vector<kv::KvIoCompletion> PollFor(KvStoreConnector& c, size_t done) {
  std::vector<kv::KvIoCompletion> out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < done && std::chrono::steady_clock::now() < until) {
    for (kv::KvIoCompletion& x : c.Poll()) out.push_back(std::move(x));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return out;
}

// Matches until the answer is no longer pending (or 10 s passed).
kv::KvConnectorMatch MatchKnown(KvStoreConnector& c, const std::vector<kv::BlockHash>& chain) {
  kv::KvConnectorMatch m;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    m = c.Match(chain, 0, chain.size());
    if (m.pending) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } while (m.pending && std::chrono::steady_clock::now() < until);
  return m;
}

void SaveAll(KvStoreConnector& c, const std::vector<kv::BlockHash>& chain,
             const std::vector<std::vector<std::byte>>& blocks) {
  for (size_t i = 0; i < chain.size(); ++i) {
    ASSERT_TRUE(c.StartSave(chain[i], i == 0 ? kv::kRootBlockHash : chain[i - 1], blocks[i], kv::Checksum(blocks[i]))
                    .ok());
  }
  for (const kv::KvIoCompletion& done : PollFor(c, chain.size())) EXPECT_TRUE(done.status.ok()) << done.status;
}

TEST(KvStoreConnectorTest, WhatOneWorkerSavesAnotherLoadsBitForBit) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const std::vector<kv::BlockHash> chain = Chain(8);
  const auto blocks = RandomBlocks(8, kBlockBytes, 1);
  auto a = Connector(server->address());
  SaveAll(*a, chain, blocks);
  EXPECT_EQ(a->stats().blocks_offloaded, 8);
  EXPECT_EQ(server->store().Stats().num_blocks, 8);

  auto b = Connector(server->address());
  const kv::KvConnectorMatch first = b->Match(chain, 0, chain.size());
  EXPECT_TRUE(first.pending) << "B knows nothing yet: it asks the store and says so";
  EXPECT_EQ(first.num_blocks, 0);
  EXPECT_EQ(MatchKnown(*b, chain).num_blocks, 8);
  std::vector<std::vector<std::byte>> slots(8, std::vector<std::byte>(kBlockBytes));
  for (size_t i = 0; i < chain.size(); ++i) ASSERT_TRUE(b->StartLoad(chain[i], slots[i]).ok());
  const std::vector<kv::KvIoCompletion> loaded = PollFor(*b, 8);
  ASSERT_EQ(loaded.size(), 8u);
  for (const kv::KvIoCompletion& c : loaded) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.bytes, kBlockBytes);
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(slots[i], blocks[i]) << i;
    EXPECT_EQ(loaded[i].checksum, kv::Checksum(blocks[i]));
  }
  EXPECT_EQ(b->stats().blocks_onboarded, 8);
  EXPECT_GT(b->stats().read_bytes_per_second, 0);
  EXPECT_EQ(b->num_in_flight(), 0);
}

TEST(KvStoreConnectorTest, AMatchOfALeadingRunCountsAHit) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const std::vector<kv::BlockHash> chain = Chain(8);
  SaveAll(*Connector(server->address()), std::vector<kv::BlockHash>(chain.begin(), chain.begin() + 4),
          RandomBlocks(4, kBlockBytes, 6));
  auto c = Connector(server->address());
  EXPECT_EQ(MatchKnown(*c, chain).num_blocks, 4) << "the first 4 are held, the 5th known missing";
  EXPECT_EQ(c->stats().hits, 1);
}

TEST(KvStoreConnectorTest, AnotherRanksOrScopesBlocksNeverHit) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const std::vector<kv::BlockHash> chain = Chain(4);
  SaveAll(*Connector(server->address()), chain, RandomBlocks(4, kBlockBytes, 2));
  EXPECT_EQ(MatchKnown(*Connector(server->address(), Scope(/*tp_rank=*/1)), chain).num_blocks, 0);
  StoreKeyScope salted = Scope();
  salted.cache_salt = "tenant-b";
  EXPECT_EQ(MatchKnown(*Connector(server->address(), salted), chain).num_blocks, 0);
  EXPECT_EQ(MatchKnown(*Connector(server->address()), chain).num_blocks, 4);
}

// Workers save and load with one scope (cache_salt empty); a request's cache_salt is in
// its chained block hashes (kv/block_hash.h), so the store keys a tenant's blocks under
// names that no other salt, nor no salt, derives. Fails if the salt did not reach the
// hashes: then every request's prompt would name tenant A's blocks.
TEST(KvStoreConnectorTest, BlocksSavedUnderOneCacheSaltAreNeverLoadedUnderAnother) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const std::vector<int32_t> prompt = [] {
    std::vector<int32_t> v(4 * 16);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(1000 + i);
    return v;
  }();
  constexpr uint64_t kModelSalt = 0x5eed;
  auto chain = [&](std::string_view cache_salt) { return kv::HashFullBlocks(prompt, 16, kModelSalt, cache_salt); };
  const std::vector<kv::BlockHash> tenant_a = chain("tenant-a");
  const auto blocks = RandomBlocks(4, kBlockBytes, 5);
  SaveAll(*Connector(server->address()), tenant_a, blocks);
  ASSERT_EQ(server->store().Stats().num_blocks, 4);

  // Another worker, the same prompt: tenant B and an unsalted request miss every block.
  auto other = Connector(server->address());
  for (const std::string_view salt : {"tenant-b", ""}) {
    const std::vector<kv::BlockHash> theirs = chain(salt);
    EXPECT_EQ(MatchKnown(*other, theirs).num_blocks, 0) << "salt '" << salt << "'";
    std::vector<std::byte> slot(kBlockBytes);
    for (const kv::BlockHash& h : theirs) {
      EXPECT_EQ(other->StartLoad(h, slot).status().code(), absl::StatusCode::kNotFound) << "salt '" << salt << "'";
    }
  }
  // Tenant A on that worker loads its own blocks, bit for bit.
  ASSERT_EQ(MatchKnown(*other, tenant_a).num_blocks, 4);
  std::vector<std::vector<std::byte>> slots(4, std::vector<std::byte>(kBlockBytes));
  for (size_t i = 0; i < tenant_a.size(); ++i) ASSERT_TRUE(other->StartLoad(tenant_a[i], slots[i]).ok());
  for (const kv::KvIoCompletion& done : PollFor(*other, 4)) EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(slots, blocks);
  EXPECT_EQ(other->stats().blocks_onboarded, 4);
}

TEST(KvStoreConnectorTest, AHungOrDeadStoreIsAMissWithinTheLookupDeadline) {
  SilentListener hung;
  std::string dead;
  {
    SilentListener closed;
    dead = closed.address();
  }
  for (const std::string& address : {hung.address(), dead}) {
    auto c = Connector(address, Scope(), /*lookup_timeout_ms=*/300);
    const std::vector<kv::BlockHash> chain = Chain(4);
    const auto start = std::chrono::steady_clock::now();
    const kv::KvConnectorMatch m = MatchKnown(*c, chain);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(m.pending) << address;
    EXPECT_EQ(m.num_blocks, 0) << address;
    EXPECT_LT(seconds, 2.0) << address << ": the wait is bounded by the lookup's deadline";
    std::vector<std::byte> slot(kBlockBytes);
    EXPECT_EQ(c->StartLoad(chain[0], slot).status().code(), absl::StatusCode::kNotFound);
  }
}

TEST(KvStoreConnectorTest, ALoadTheRestartedStoreCannotServeFailsAndIsNotServed) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const int port = server->port();
  const std::vector<kv::BlockHash> chain = Chain(4);
  const auto blocks = RandomBlocks(4, kBlockBytes, 3);
  auto c = Connector(server->address());
  SaveAll(*c, chain, blocks);
  ASSERT_EQ(MatchKnown(*c, chain).num_blocks, 4) << "believed held since the save";
  // The store restarts empty (a new epoch) before the load.
  server.reset();
  server = KvStoreServer::Start(StoreOptions(port)).value();
  std::vector<std::vector<std::byte>> slots(4, std::vector<std::byte>(kBlockBytes, std::byte{0}));
  for (size_t i = 0; i < chain.size(); ++i) ASSERT_TRUE(c->StartLoad(chain[i], slots[i]).ok());
  const std::vector<kv::KvIoCompletion> done = PollFor(*c, 4);
  ASSERT_EQ(done.size(), 4u);
  for (const kv::KvIoCompletion& d : done) EXPECT_FALSE(d.status.ok()) << "an empty store serves nothing";
  for (const auto& s : slots) EXPECT_EQ(s, std::vector<std::byte>(kBlockBytes, std::byte{0}));
  // And the connector forgot what it believed: the next lookup asks again and misses.
  EXPECT_EQ(MatchKnown(*c, chain).num_blocks, 0);
}

TEST(KvStoreConnectorTest, ARestartSeenByAnyCallForgetsEveryBeliefAndTheBlocksAreSavedAgain) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const int port = server->port();
  const std::vector<kv::BlockHash> chain = Chain(4);
  const auto blocks = RandomBlocks(4, kBlockBytes, 4);
  // Answers believed for a minute: only the restart can make the connector forget them.
  auto c = ConnectorWith(server->address(), {.scope = Scope(), .believe_ms = 60'000});
  SaveAll(*c, chain, blocks);
  ASSERT_TRUE(c->Contains(chain[0])) << "believed held since the save";
  EXPECT_EQ(c->StartSave(chain[0], kv::kRootBlockHash, blocks[0], kv::Checksum(blocks[0])).status().code(),
            absl::StatusCode::kAlreadyExists);

  // The store restarts empty (a new epoch). A lookup of another chain is the first call
  // to hear of it.
  server.reset();
  server = KvStoreServer::Start(StoreOptions(port)).value();
  std::vector<kv::BlockHash> other;
  for (int i = 0; i < 2; ++i) other.push_back(kv::BlockHash{.low = 900 + static_cast<uint64_t>(i), .high = 9});
  EXPECT_EQ(MatchKnown(*c, other).num_blocks, 0);
  ASSERT_EQ(c->client().stats().epoch_changes, 1);

  // Nothing of the old epoch is believed any more, and the blocks are saved again.
  EXPECT_FALSE(c->Contains(chain[0])) << "a block of the old epoch is still believed held";
  c->Poll();
  EXPECT_EQ(c->stats().peer_restarts, 1);
  std::vector<std::byte> slot(kBlockBytes);
  EXPECT_EQ(c->StartLoad(chain[0], slot).status().code(), absl::StatusCode::kNotFound);
  SaveAll(*c, chain, blocks);
  EXPECT_EQ(server->store().Stats().num_blocks, 4) << "the restarted store got the blocks again";
  EXPECT_EQ(MatchKnown(*c, chain).num_blocks, 4);
}

TEST(KvStoreConnectorTest, ALoadTheStoreHungUnderFailsWithoutLoweringTheMeasuredBandwidth) {
  auto server = KvStoreServer::Start(StoreOptions()).value();
  const int port = server->port();
  const std::vector<kv::BlockHash> chain = Chain(8);
  const auto blocks = RandomBlocks(8, kBlockBytes, 5);
  auto c = ConnectorWith(server->address(), {.scope = Scope(), .load_timeout_ms = 300, .believe_ms = 60'000});
  SaveAll(*c, chain, blocks);
  std::vector<std::vector<std::byte>> slots(8, std::vector<std::byte>(kBlockBytes));
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(c->StartLoad(chain[i], slots[i]).ok());
  for (const kv::KvIoCompletion& done : PollFor(*c, 4)) ASSERT_TRUE(done.status.ok()) << done.status;
  const double measured = c->stats().read_bytes_per_second;
  ASSERT_GT(measured, 0);

  // The store hangs (its port accepts and never answers): the other loads wait out
  // their deadline and fail, and are recomputed.
  server.reset();
  SilentListener hung(port);
  for (size_t i = 4; i < 8; ++i) ASSERT_TRUE(c->StartLoad(chain[i], slots[i]).ok());
  const std::vector<kv::KvIoCompletion> failed = PollFor(*c, 4);
  ASSERT_EQ(failed.size(), 4u);
  for (const kv::KvIoCompletion& done : failed) EXPECT_FALSE(done.status.ok());
  EXPECT_EQ(c->stats().read_failures, 4);
  // That wait measured the hung store, not how fast a store serves: counted, it would
  // have the engine recompute every store's blocks (kv_tiers.h) until it decayed.
  EXPECT_DOUBLE_EQ(c->stats().read_bytes_per_second, measured);
}

}  // namespace
}  // namespace kvmesh::kv_store
