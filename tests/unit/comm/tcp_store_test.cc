#include <thread>

#include "comm/tcp_store_client.h"
#include "comm/tcp_store_server.h"
#include "gtest/gtest.h"

namespace kvmesh::comm {
namespace {

TEST(TcpStoreTest, GetReturnsWhatAnotherClientSet) {
  auto server = TcpStoreServer::Start({}).value();
  auto a = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  auto b = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  ASSERT_TRUE(a->Set("k", std::string("v\0w", 3)).ok());
  auto value = b->Get("k", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("v\0w", 3));
}

TEST(TcpStoreTest, GetWaitsForALaterSet) {
  auto server = TcpStoreServer::Start({}).value();
  auto reader = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  std::thread writer([&] {
    auto w = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(w->Set("late", "x").ok());
  });
  auto value = reader->Get("late", absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "x");
}

TEST(TcpStoreTest, GetOfAMissingKeyTimesOut) {
  auto server = TcpStoreServer::Start({}).value();
  auto client = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  const absl::Time start = absl::Now();
  EXPECT_EQ(client->Get("never", absl::Milliseconds(200)).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // The connection stays usable after a timeout.
  EXPECT_TRUE(client->Set("after", "1").ok());
}

TEST(TcpStoreTest, ConnectWithoutServerFailsAtTheDeadline) {
  int port = 0;
  {
    auto server = TcpStoreServer::Start({}).value();
    port = server->port();
  }
  const absl::Time start = absl::Now();
  auto client = TcpStoreClient::Connect("127.0.0.1:" + std::to_string(port), absl::Milliseconds(200));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(TcpStoreTest, StoppedServerTurnsIntoUnavailable) {
  auto server = TcpStoreServer::Start({}).value();
  auto client = TcpStoreClient::Connect(server->address(), absl::Seconds(5)).value();
  server->Stop();
  EXPECT_EQ(client->Get("k", absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
}

TEST(TcpStoreTest, MalformedAddressIsInvalidArgument) {
  EXPECT_EQ(TcpStoreClient::Connect("nohost", absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::comm
