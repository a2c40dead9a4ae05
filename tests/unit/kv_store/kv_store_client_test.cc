// KvStoreClient against real KvStoreServers in this process (gRPC on 127.0.0.1), a
// listener that never answers (a hung store), a closed port (a dead one) and a fake
// store that serves corrupt bytes.
#include "kv_store/kv_store_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kv/checksum.h"
#include "kv_store/kv_store_wire.h"
#include "kv_store_server/kv_store_server.h"
#include "store_test_util.h"
#include "kvmesh/v1/kv_store.grpc.pb.h"
#include "rpc/grpc_server.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kBlockBytes = 4096;

KvStoreServerOptions StoreOptions(int port = 0) {
  KvStoreServerOptions o;
  o.listen_address = absl::StrCat("127.0.0.1:", port);
  o.store = {.capacity_blocks = 256, .slot_bytes = kBlockBytes, .lease_ms = 5000, .max_lease_ms = 30000};
  o.metrics_port = -1;
  return o;
}

std::vector<StoreKey> Keys(int n, uint64_t salt = 0) {
  std::vector<StoreKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(StoreKey{.low = 1000 + static_cast<uint64_t>(i), .high = salt});
  return keys;
}

std::vector<std::span<const std::byte>> Spans(const std::vector<std::vector<std::byte>>& blocks) {
  return {blocks.begin(), blocks.end()};
}

std::vector<std::span<std::byte>> Spans(std::vector<std::vector<std::byte>>& blocks) {
  return {blocks.begin(), blocks.end()};
}

absl::Time Deadline(int64_t ms = 5000) { return absl::Now() + absl::Milliseconds(ms); }

// A port nothing listens on: a dead store.
std::string DeadAddress() {
  SilentListener closed;  // bound, then closed at the end of this scope
  return closed.address();
}

class KvStoreClientTest : public ::testing::Test {
 protected:
  void StartStores(int n) {
    for (int i = 0; i < n; ++i) servers_.push_back(KvStoreServer::Start(StoreOptions()).value());
  }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> a;
    for (const auto& s : servers_) a.push_back(absl::StrCat("127.0.0.1:", s->port()));
    return a;
  }
  std::unique_ptr<KvStoreClient> Client(std::vector<std::string> addresses, int64_t warmup_ms = 0,
                                        std::string api_key = "") {
    return KvStoreClient::Create({.addresses = std::move(addresses), .api_key = std::move(api_key),
                                  .warmup_ms = warmup_ms})
        .value();
  }
  // Replaces store `i` by a fresh one on the same port: empty, with a new epoch.
  void Restart(int i) {
    const int port = servers_[i]->port();
    servers_[i].reset();
    servers_[i] = KvStoreServer::Start(StoreOptions(port)).value();
  }
  // Looks `key` up until `client` has heard store `i`'s current epoch (its channel may
  // first have to reconnect).
  void LearnEpoch(KvStoreClient& client, int i, const StoreKey& key) {
    for (int attempt = 0; attempt < 50 && client.epoch(i) != servers_[i]->store().epoch(); ++attempt) {
      if (client.epoch(i) != servers_[i]->store().epoch()) absl::SleepFor(absl::Milliseconds(100));
      KvStoreLookup lookup = client.Lookup({{key}}, Deadline(1000));
      client.Release(lookup, Deadline(1000));
    }
    ASSERT_EQ(client.epoch(i), servers_[i]->store().epoch());
  }

  std::vector<std::unique_ptr<KvStoreServer>> servers_;
};

TEST_F(KvStoreClientTest, CreateRefusesNoOrRepeatedAddresses) {
  EXPECT_EQ(KvStoreClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStoreClient::Create({.addresses = {"a:1", "a:1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreClientTest, PutLookupGetRoundTripsBitIdenticallyOverSeveralStores) {
  StartStores(3);
  auto client = Client(Addresses());
  const std::vector<StoreKey> keys = Keys(48);
  const auto blocks = RandomBlocks(48, kBlockBytes, 1);
  const KvStorePutResult put = client->Put(keys, Spans(blocks), {}, Deadline());
  ASSERT_TRUE(put.error.ok()) << put.error;
  EXPECT_EQ(put.num_committed, 48);

  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, 48) << lookup.error;
  EXPECT_EQ(std::set<int>(lookup.homes.begin(), lookup.homes.end()).size(), 3u) << "keys should span every store";
  std::vector<std::vector<std::byte>> out(48, std::vector<std::byte>(kBlockBytes));
  const KvStoreGetResult got = client->Get(lookup, Spans(out), Deadline());
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.num_loaded, 48);
  EXPECT_EQ(out, blocks);
  int64_t leases = 0;
  for (const auto& s : servers_) leases += s->store().Stats().num_leases;
  EXPECT_EQ(leases, 0) << "Get releases the leases it read under";
  EXPECT_EQ(client->stats().get_blocks, 48);
}

TEST_F(KvStoreClientTest, LookupStopsAtTheFirstMissingBlockOfTheChain) {
  StartStores(2);
  auto client = Client(Addresses());
  const std::vector<StoreKey> keys = Keys(10);
  const auto blocks = RandomBlocks(10, kBlockBytes, 2);
  std::vector<StoreKey> some = {keys[0], keys[1], keys[2], keys[5]};
  std::vector<std::span<const std::byte>> some_blocks = {blocks[0], blocks[1], blocks[2], blocks[5]};
  ASSERT_EQ(client->Put(some, some_blocks, {}, Deadline()).num_committed, 4);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  EXPECT_EQ(lookup.num_present, 3);
  client->Release(lookup, Deadline());
  int64_t leases = 0;
  for (const auto& s : servers_) leases += s->store().Stats().num_leases;
  EXPECT_EQ(leases, 0);
}

TEST_F(KvStoreClientTest, APutOfBlocksTheClientKnowsAreStoredSendsNothing) {
  StartStores(1);
  auto client = Client(Addresses());
  const std::vector<StoreKey> keys = Keys(8);
  const auto blocks = RandomBlocks(8, kBlockBytes, 3);
  ASSERT_EQ(client->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 8);
  const KvStorePutResult again = client->Put(keys, Spans(blocks), {}, Deadline());
  EXPECT_EQ(again.num_committed, 0);
  EXPECT_EQ(again.num_present, 8);
  EXPECT_EQ(servers_[0]->store().Stats().put_blocks, 8);
  // Another client does not know: the store says they are present.
  const KvStorePutResult other = Client(Addresses())->Put(keys, Spans(blocks), {}, Deadline());
  EXPECT_EQ(other.num_present, 8);
  EXPECT_EQ(other.num_committed, 0);
}

// The test that fails if epochs are ignored: after a restart the client must forget
// what it believed the store held, or it never puts those blocks again.
TEST_F(KvStoreClientTest, ANewEpochMakesTheClientForgetWhatTheStoreHeld) {
  StartStores(1);
  auto client = Client(Addresses());
  const std::vector<StoreKey> keys = Keys(2);
  const auto blocks = RandomBlocks(2, kBlockBytes, 4);
  ASSERT_EQ(client->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 2);
  const uint64_t first_epoch = client->epoch(0);
  ASSERT_NE(first_epoch, 0u);

  Restart(0);
  // A lookup of the first block misses and brings the new epoch.
  LearnEpoch(*client, 0, keys[0]);
  EXPECT_NE(client->epoch(0), first_epoch);
  EXPECT_EQ(client->stats().epoch_changes, 1);
  // The second block was never looked up; only the epoch says it is gone.
  const KvStorePutResult put = client->Put({{keys[1]}}, {{blocks[1]}}, {}, Deadline());
  EXPECT_EQ(put.num_committed, 1);
  EXPECT_EQ(put.num_present, 0);
  EXPECT_EQ(client->Lookup({{keys[1]}}, Deadline()).num_present, 1);
}

TEST_F(KvStoreClientTest, AGetUnderALeaseOfAnEarlierEpochIsAMiss) {
  StartStores(1);
  auto client = Client(Addresses());
  const std::vector<StoreKey> keys = Keys(1);
  const auto blocks = RandomBlocks(1, kBlockBytes, 5);
  ASSERT_EQ(client->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 1);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, 1);
  Restart(0);
  // The same block put again by someone else: the old lease still must not be honoured.
  ASSERT_EQ(Client(Addresses())->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 1);
  std::vector<std::vector<std::byte>> out(1, std::vector<std::byte>(kBlockBytes));
  const KvStoreGetResult got = client->Get(lookup, Spans(out), Deadline());
  EXPECT_EQ(got.num_loaded, 0);
  EXPECT_EQ(got.error.code(), absl::StatusCode::kFailedPrecondition) << got.error;
}

TEST_F(KvStoreClientTest, ARestartedStoreIsGivenPutsGradually) {
  StartStores(1);
  auto client = Client(Addresses(), /*warmup_ms=*/60'000);
  const std::vector<StoreKey> keys = Keys(64);
  const auto blocks = RandomBlocks(64, kBlockBytes, 6);
  // First contact is not a restart: no warm-up.
  EXPECT_EQ(client->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 64);
  Restart(0);
  LearnEpoch(*client, 0, keys[0]);
  const KvStorePutResult put = client->Put(keys, Spans(blocks), {}, Deadline());
  EXPECT_GT(put.num_skipped, 48) << "right after the restart, few puts go to it";
  EXPECT_EQ(put.num_committed + put.num_skipped, 64);
}

TEST_F(KvStoreClientTest, AHungStoreIsAMissWithinTheDeadline) {
  StartStores(1);
  SilentListener hung;
  auto client = Client({Addresses()[0], hung.address()});
  const std::vector<StoreKey> keys = Keys(32);
  const auto blocks = RandomBlocks(32, kBlockBytes, 7);
  const absl::Time start = absl::Now();
  const KvStorePutResult put = client->Put(keys, Spans(blocks), {}, start + absl::Milliseconds(300));
  const KvStoreLookup lookup = client->Lookup(keys, absl::Now() + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Milliseconds(1500)) << "two calls of 300 ms each";
  EXPECT_GT(put.num_committed, 0);      // the live store's share
  EXPECT_GT(put.num_not_stored, 0);     // the hung one's
  EXPECT_FALSE(put.error.ok());
  EXPECT_LT(lookup.num_present, 32);
  EXPECT_FALSE(lookup.error.ok());
  EXPECT_GE(client->stats().store_errors, 2);
}

TEST_F(KvStoreClientTest, ADeadStoreIsAMissAndTheOthersShareStillHits) {
  StartStores(1);
  const std::string dead = DeadAddress();
  auto client = Client({Addresses()[0], dead});
  const std::vector<StoreKey> keys = Keys(64);
  const auto blocks = RandomBlocks(64, kBlockBytes, 8);
  client->Put(keys, Spans(blocks), {}, Deadline(2000));
  // Each key on its own: the live store's keys all hit.
  int hits = 0;
  int live_keys = 0;
  for (const StoreKey& key : keys) {
    const KvStoreLookup one = client->Lookup({{key}}, Deadline(2000));
    hits += one.num_present;
  }
  for (const StoreKey& key : keys) {
    live_keys += servers_[0]->store().Lookup({{key}}).num_present;
  }
  EXPECT_GT(hits, 0);
  EXPECT_EQ(hits, live_keys);
  EXPECT_LT(hits, 64);
}

TEST_F(KvStoreClientTest, AnotherCacheSaltNeverHits) {
  StartStores(2);
  auto client = Client(Addresses());
  const kv::KvBlockSpec spec{.num_layers = 2, .num_kv_heads = 1, .head_dim = 8, .block_size_tokens = 16,
                             .block_bytes = 512};
  const StoreKeySpace a = StoreKeySpace::Create({.model = "m", .block_spec = spec, .cache_salt = "tenant-a"}).value();
  const StoreKeySpace b = StoreKeySpace::Create({.model = "m", .block_spec = spec, .cache_salt = "tenant-b"}).value();
  const StoreKeySpace none = StoreKeySpace::Create({.model = "m", .block_spec = spec}).value();
  std::vector<kv::BlockHash> chain;
  for (uint64_t i = 0; i < 16; ++i) chain.push_back({.low = i, .high = 99});
  const auto blocks = RandomBlocks(16, kBlockBytes, 9);
  ASSERT_EQ(client->Put(a.Keys(chain), Spans(blocks), {}, Deadline()).num_committed, 16);
  EXPECT_EQ(client->Lookup(a.Keys(chain), Deadline()).num_present, 16);
  EXPECT_EQ(client->Lookup(b.Keys(chain), Deadline()).num_present, 0);
  EXPECT_EQ(client->Lookup(none.Keys(chain), Deadline()).num_present, 0);
}

TEST_F(KvStoreClientTest, WithApiKeysAClientWithoutTheKeyCannotLookUpPutOrGet) {
  KvStoreServerOptions o = StoreOptions();
  o.api_keys = {"secret"};
  servers_.push_back(KvStoreServer::Start(o).value());
  auto good = Client(Addresses(), 0, "secret");
  auto none = Client(Addresses());
  auto wrong = Client(Addresses(), 0, "guess");
  const std::vector<StoreKey> keys = Keys(4);
  const auto blocks = RandomBlocks(4, kBlockBytes, 10);
  for (KvStoreClient* c : {none.get(), wrong.get()}) {
    const KvStorePutResult put = c->Put(keys, Spans(blocks), {}, Deadline());
    EXPECT_EQ(put.num_committed, 0);
    EXPECT_EQ(put.error.code(), absl::StatusCode::kUnauthenticated) << put.error;
  }
  EXPECT_EQ(servers_[0]->store().Stats().num_intents, 0);
  ASSERT_EQ(good->Put(keys, Spans(blocks), {}, Deadline()).num_committed, 4);
  KvStoreLookup lookup = good->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, 4);
  for (KvStoreClient* c : {none.get(), wrong.get()}) {
    const KvStoreLookup denied = c->Lookup(keys, Deadline());
    EXPECT_EQ(denied.num_present, 0);
    EXPECT_EQ(denied.error.code(), absl::StatusCode::kUnauthenticated) << denied.error;
    // A Get with a lease stolen from the good client's lookup.
    KvStoreLookup stolen = lookup;
    std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(kBlockBytes));
    const KvStoreGetResult got = c->Get(stolen, Spans(out), Deadline());
    EXPECT_EQ(got.num_loaded, 0);
    EXPECT_EQ(got.error.code(), absl::StatusCode::kUnauthenticated) << got.error;
  }
}

// A store that claims every key and serves bytes whose checksum does not match from
// block `corrupt_from` on.
class CorruptStore final : public v1::KvStore::Service {
 public:
  explicit CorruptStore(int corrupt_from) : corrupt_from_(corrupt_from) {}
  grpc::Status Lookup(grpc::ServerContext*, const v1::KvLookupRequest* request,
                      v1::KvLookupResponse* response) override {
    response->set_epoch(kEpoch);
    response->set_num_present(request->keys_size());
    response->set_lease_id(1);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::KvGetRequest* request,
                   grpc::ServerWriter<v1::KvGetBlock>* writer) override {
    for (int i = 0; i < request->keys_size(); ++i) {
      v1::KvGetBlock block;
      block.set_epoch(kEpoch);
      *block.mutable_key() = request->keys(i);
      std::string data(kBlockBytes, 'x');
      block.set_checksum(kv::Checksum({reinterpret_cast<const std::byte*>(data.data()), data.size()}) +
                         (i >= corrupt_from_ ? 1 : 0));
      block.set_data(std::move(data));
      writer->Write(block);
    }
    return grpc::Status::OK;
  }
  static constexpr uint64_t kEpoch = 77;

 private:
  const int corrupt_from_;
};

TEST_F(KvStoreClientTest, ABlockFailingItsChecksumIsAMissAndIsCounted) {
  CorruptStore corrupt(/*corrupt_from=*/2);
  auto server =
      rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{&corrupt, v1::KvStore::service_full_name()}}).value();
  auto client = Client({absl::StrCat("127.0.0.1:", server->port())});
  const std::vector<StoreKey> keys = Keys(4);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, 4);
  std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(kBlockBytes, std::byte{0}));
  const KvStoreGetResult got = client->Get(lookup, Spans(out), Deadline());
  EXPECT_EQ(got.num_loaded, 2);
  EXPECT_EQ(got.error.code(), absl::StatusCode::kDataLoss) << got.error;
  EXPECT_EQ(out[2], std::vector<std::byte>(kBlockBytes, std::byte{0})) << "an unverified block was copied out";
  EXPECT_EQ(client->stats().checksum_failures, 1);
  EXPECT_EQ(client->stats().get_blocks, 2);
}

TEST_F(KvStoreClientTest, GetRefusesMoreBlocksThanTheLookupFound) {
  StartStores(1);
  auto client = Client(Addresses());
  KvStoreLookup lookup = client->Lookup(Keys(2), Deadline());
  std::vector<std::vector<std::byte>> out(1, std::vector<std::byte>(kBlockBytes));
  EXPECT_EQ(client->Get(lookup, Spans(out), Deadline()).error.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::kv_store
