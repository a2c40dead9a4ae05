// The real kvmesh-kv-store with its UCX data plane (--data_plane=ucx), driven by a
// KvStoreClient whose blocks live in a pool registered with its own UcxKvTransport,
// on shared memory ("sm": cross-memory attach on one host) and on tcp: SmolLM2-shaped
// blocks go in and come back bit for bit over UCX (in concurrent pieces); a block corrupted after it landed is
// refused and fetched over the gRPC stream instead; a put whose checksum does not match
// the pushed bytes is refused and never visible; a store without the data plane still
// serves such a client over the stream; a store stopped or killed before its push is a
// miss within the deadline, never a hang.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "child_process.h"
#include "smollm2_store_block.h"
#include "core/dtype.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/store_data_plane.h"
#include "kv_store/store_key.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kBlockBytes = kSmolLm2BlockBytes;
constexpr int32_t kPoolBlocks = 64;
constexpr int kN = 16;
constexpr int kPiece = 4;

class StoreProcess {
 public:
  void Start(const std::string& data_plane, const std::string& tls) {
    process_.Start({KVMESH_KV_STORE_BIN, "--listen=127.0.0.1:0", absl::StrCat("--block_bytes=", kBlockBytes),
                    "--capacity_blocks=256", "--metrics_port=-1", "--shutdown_grace_ms=1000",
                    "--data_plane=" + data_plane, "--data_plane_ucx_tls=" + tls,
                    // Trusted (this test's) clients: gets written straight in on one host.
                    "--data_plane_cma_gets"},
                   "kv-store listening");
  }
  std::string address() { return absl::StrCat("127.0.0.1:", process_.port()); }
  testing::ChildProcess& process() { return process_; }

 private:
  testing::ChildProcess process_;
};

absl::Time Deadline() { return absl::Now() + absl::Seconds(10); }

StoreKeySpace Space() { return StoreKeySpace::Create({.model = "smollm2-135m", .block_spec = kSmolLm2Block}).value(); }

std::vector<kv::BlockHash> Chain(int n, uint64_t prompt) {
  std::vector<kv::BlockHash> chain;
  for (int i = 0; i < n; ++i) chain.push_back({.low = static_cast<uint64_t>(i), .high = prompt});
  return chain;
}

class KvStoreUcxTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    memory_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, kBlockBytes * kPoolBlocks)));
    std::mt19937_64 rng(7);
    for (int64_t i = 0; i < kBlockBytes * kPoolBlocks; i += 8) {
      const uint64_t v = rng();
      std::memcpy(memory_.get() + i, &v, 8);
    }
    transport_ = kv::UcxKvTransport::Create({.tls = GetParam(), .checksum_runs = false}).value();
  }

  std::unique_ptr<KvStoreClient> Client(const std::string& address) {
    KvStoreDataPlane plane = RegisterDataPlane(*transport_, memory_.get(), kBlockBytes, kPoolBlocks).value();
    plane.max_blocks_per_transfer = kPiece;  // four concurrent pieces of a 16-block call
    plane.after_landing = [this](std::span<std::byte> block) {
      if (corrupt_next_.exchange(false)) block[block.size() / 2] ^= std::byte{1};
    };
    return KvStoreClient::Create({.addresses = {address}, .warmup_ms = 0, .data_plane = std::move(plane)}).value();
  }

  std::span<std::byte> Block(int i) { return {memory_.get() + i * kBlockBytes, static_cast<size_t>(kBlockBytes)}; }
  std::vector<std::span<const std::byte>> ConstBlocks(int first, int n) {
    std::vector<std::span<const std::byte>> out;
    for (int i = 0; i < n; ++i) out.push_back(Block(first + i));
    return out;
  }
  std::vector<std::span<std::byte>> Blocks(int first, int n) {
    std::vector<std::span<std::byte>> out;
    for (int i = 0; i < n; ++i) out.push_back(Block(first + i));
    return out;
  }

  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  std::unique_ptr<kv::UcxKvTransport> transport_;
  std::atomic<bool> corrupt_next_{false};
};

TEST_P(KvStoreUcxTest, PutsAndGetsBitIdenticallyOverUcx) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start("ucx", GetParam()));
  auto client = Client(store.address());
  const std::vector<StoreKey> keys = Space().Keys(Chain(kN, 1));
  const KvStorePutResult put = client->Put(keys, ConstBlocks(0, kN), {}, Deadline());
  ASSERT_TRUE(put.error.ok()) << put.error;
  EXPECT_EQ(put.num_committed, kN);
  EXPECT_EQ(client->stats().ucx_put_blocks, kN);

  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, kN);
  const KvStoreGetResult got = client->Get(lookup, Blocks(32, kN), Deadline());
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.num_loaded, kN);
  EXPECT_EQ(client->stats().ucx_get_blocks, kN);
  EXPECT_EQ(client->stats().ucx_fallbacks, 0);
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(std::memcmp(Block(i).data(), Block(32 + i).data(), kBlockBytes), 0) << "block " << i;
  }
}

TEST_P(KvStoreUcxTest, RefusesABlockCorruptedAfterLandingAndFetchesItOverTheStream) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start("ucx", GetParam()));
  auto client = Client(store.address());
  const std::vector<StoreKey> keys = Space().Keys(Chain(kN, 2));
  ASSERT_EQ(client->Put(keys, ConstBlocks(0, kN), {}, Deadline()).num_committed, kN);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, kN);
  std::memset(Block(32).data(), 0, kBlockBytes * kN);
  corrupt_next_ = true;
  const KvStoreGetResult got = client->Get(lookup, Blocks(32, kN), Deadline());
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.num_loaded, kN);
  const KvStoreClientStats stats = client->stats();
  EXPECT_EQ(stats.checksum_failures, 1);
  EXPECT_EQ(stats.ucx_fallbacks, 1);            // the corrupted block's piece, over the stream
  EXPECT_EQ(stats.ucx_get_blocks, kN - kPiece);  // the other pieces
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(std::memcmp(Block(i).data(), Block(32 + i).data(), kBlockBytes), 0) << "block " << i;
  }
}

TEST_P(KvStoreUcxTest, RefusesAPutWhoseBytesDoNotMatchTheirChecksum) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start("ucx", GetParam()));
  auto client = Client(store.address());
  const std::vector<StoreKey> keys = Space().Keys(Chain(kN, 3));
  std::vector<uint64_t> checksums(kN, 0x1234);  // not the bytes' XXH3
  const KvStorePutResult put = client->Put(keys, ConstBlocks(0, kN), checksums, Deadline());
  EXPECT_EQ(put.error.code(), absl::StatusCode::kDataLoss) << put.error;
  EXPECT_EQ(put.num_committed, 0);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  EXPECT_EQ(lookup.num_present, 0);
}

TEST_P(KvStoreUcxTest, AStoreWithoutTheDataPlaneServesOverTheStream) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start("grpc", ""));
  auto client = Client(store.address());
  const std::vector<StoreKey> keys = Space().Keys(Chain(kN, 4));
  ASSERT_EQ(client->Put(keys, ConstBlocks(0, kN), {}, Deadline()).num_committed, kN);
  KvStoreLookup lookup = client->Lookup(keys, Deadline());
  ASSERT_EQ(lookup.num_present, kN);
  const KvStoreGetResult got = client->Get(lookup, Blocks(32, kN), Deadline());
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(got.num_loaded, kN);
  EXPECT_EQ(client->stats().ucx_put_blocks, 0);
  EXPECT_EQ(client->stats().ucx_get_blocks, 0);
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(std::memcmp(Block(i).data(), Block(32 + i).data(), kBlockBytes), 0) << "block " << i;
  }
}

TEST_P(KvStoreUcxTest, AStoreStoppedOrKilledBeforeItsPushIsAMissWithinTheDeadline) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start("ucx", GetParam()));
  auto client = Client(store.address());
  const std::vector<StoreKey> keys = Space().Keys(Chain(kN, 5));
  ASSERT_EQ(client->Put(keys, ConstBlocks(0, kN), {}, Deadline()).num_committed, kN);
  for (const int signal : {SIGSTOP, SIGKILL}) {
    KvStoreLookup lookup = client->Lookup(keys, Deadline());
    ASSERT_EQ(lookup.num_present, kN);
    store.process().Signal(signal);
    std::memset(Block(32).data(), 0, kBlockBytes * kN);
    const absl::Time start = absl::Now();
    const KvStoreGetResult got = client->Get(lookup, Blocks(32, kN), start + absl::Milliseconds(500));
    EXPECT_EQ(got.num_loaded, 0) << got.error;
    EXPECT_FALSE(got.error.ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "signal " << signal;
    if (signal == SIGSTOP) {
      store.process().Signal(SIGCONT);
      ASSERT_TRUE(client->Put(keys, ConstBlocks(0, kN), {}, Deadline()).error.ok());  // it serves again
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tls, KvStoreUcxTest, ::testing::Values("sm", "tcp"));

}  // namespace
}  // namespace kvmesh::kv_store
