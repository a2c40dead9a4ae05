#include "comm/gloo_communicator.h"

#include <functional>
#include <thread>
#include <vector>

#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "gtest/gtest.h"

namespace kvmesh::comm {
namespace {

// Runs `body(rank, communicator)` on `n` threads, each rank with its own store
// client and Gloo communicator on loopback, as ranks in separate processes would.
void RunRanks(int n, absl::Duration timeout, const std::function<void(int, GlooCommunicator&)>& body) {
  auto server = TcpStoreServer::Start({}).value();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
      auto comm = GlooCommunicator::Create({.rank = r, .world_size = n, .timeout = timeout}, *store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

class GlooCollectivesTest : public testing::TestWithParam<int> {};

TEST_P(GlooCollectivesTest, AllReduceSumsEveryRanksBuffer) {
  const int n = GetParam();
  RunRanks(n, absl::Seconds(20), [n](int r, GlooCommunicator& comm) {
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.world_size(), n);
    std::vector<float> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(r * 1000 + i);
    ASSERT_TRUE(comm.AllReduceSum(data.data(), data.size(), DType::kF32).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      const float expected = 1000.0f * n * (n - 1) / 2 + static_cast<float>(n * i);
      ASSERT_EQ(data[i], expected) << "rank " << r << " element " << i;
    }
  });
}

TEST_P(GlooCollectivesTest, AllGatherPlacesEachRankInItsSlotAlsoInPlace) {
  const int n = GetParam();
  RunRanks(n, absl::Seconds(20), [n](int r, GlooCommunicator& comm) {
    std::vector<int32_t> send = {r, 10 * r, 100 * r};
    std::vector<int32_t> out(3 * n, -1);
    ASSERT_TRUE(comm.AllGather(send.data(), out.data(), 3, DType::kInt32).ok());
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(out[3 * p], p);
      EXPECT_EQ(out[3 * p + 2], 100 * p);
    }
    std::vector<int32_t> in_place(3 * n, -1);
    std::copy(send.begin(), send.end(), in_place.begin() + 3 * r);
    ASSERT_TRUE(comm.AllGather(in_place.data() + 3 * r, in_place.data(), 3, DType::kInt32).ok());
    EXPECT_EQ(in_place, out);
  });
}

TEST_P(GlooCollectivesTest, BroadcastCopiesTheRootsBufferAndBarrierReturns) {
  const int n = GetParam();
  RunRanks(n, absl::Seconds(20), [n](int r, GlooCommunicator& comm) {
    std::vector<float> data(17, static_cast<float>(r));
    ASSERT_TRUE(comm.Broadcast(data.data(), data.size(), DType::kF32, n - 1).ok());
    EXPECT_EQ(data[16], static_cast<float>(n - 1));
    EXPECT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(comm.Broadcast(data.data(), 1, DType::kF32, n).code(), absl::StatusCode::kInvalidArgument);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooCollectivesTest, testing::Values(1, 2, 4));

TEST(GlooCommunicatorTest, AllReduceRejectsNonF32) {
  RunRanks(1, absl::Seconds(5), [](int, GlooCommunicator& comm) {
    int32_t x = 1;
    EXPECT_EQ(comm.AllReduceSum(&x, 1, DType::kInt32).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooCommunicatorTest, RendezvousWithAMissingPeerTimesOut) {
  auto server = TcpStoreServer::Start({}).value();
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  const absl::Time start = absl::Now();
  auto comm = GlooCommunicator::Create({.rank = 0, .world_size = 2, .timeout = absl::Milliseconds(500)}, *store);
  EXPECT_FALSE(comm.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(GlooCommunicatorTest, PeerThatStopsParticipatingGivesDeadlineExceededNotAHang) {
  const absl::Time start = absl::Now();
  RunRanks(2, absl::Milliseconds(1000), [](int r, GlooCommunicator& comm) {
    float x = 1;
    ASSERT_TRUE(comm.AllReduceSum(&x, 1, DType::kF32).ok());
    if (r == 1) {
      // Rank 1 stays alive but never joins the second all-reduce, then leaves.
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return;
    }
    const absl::Status status = comm.AllReduceSum(&x, 1, DType::kF32);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    // The group is broken from now on.
    EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kFailedPrecondition);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(GlooCommunicatorTest, LostPeerGivesAnErrorNotAHang) {
  auto server = TcpStoreServer::Start({}).value();
  const absl::Time start = absl::Now();
  std::thread peer([&] {
    auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
    auto comm = GlooCommunicator::Create({.rank = 1, .world_size = 2, .timeout = absl::Seconds(30)}, *store).value();
    float x = 1;
    ASSERT_TRUE(comm->AllReduceSum(&x, 1, DType::kF32).ok());
    comm.reset();  // the peer's process goes away: its sockets close
  });
  auto store = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  auto comm = GlooCommunicator::Create({.rank = 0, .world_size = 2, .timeout = absl::Seconds(30)}, *store).value();
  float x = 1;
  ASSERT_TRUE(comm->AllReduceSum(&x, 1, DType::kF32).ok());
  peer.join();
  const absl::Status status = comm->AllReduceSum(&x, 1, DType::kF32);
  EXPECT_FALSE(status.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "closing the peer should fail fast, not at the 30 s timeout";
}

}  // namespace
}  // namespace kvmesh::comm
