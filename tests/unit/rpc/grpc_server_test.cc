#include "rpc/grpc_server.h"

#include <grpcpp/client_context.h>
#include <gtest/gtest.h>

#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/status_conversion.h"

namespace kvmesh::rpc {
namespace {

// The generated base: every method answers UNIMPLEMENTED.
class EmptyScheduler final : public v1::Scheduler::CallbackService {};

TEST(GrpcServerTest, PortZeroBindsAFreePortAndServes) {
  EmptyScheduler service;
  auto server = GrpcServer::Start({.address = "127.0.0.1:0"}, {{&service, v1::Scheduler::service_full_name()}});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
  EXPECT_EQ((*server)->service_names(), std::vector<std::string>{"kvmesh.v1.Scheduler"});

  auto channel = CreateChannel((*server)->address());
  ASSERT_TRUE(WaitForConnected(*channel, 5000).ok());
  auto stub = v1::Scheduler::NewStub(channel);
  grpc::ClientContext context;
  SetTimeout(&context, 5000);
  v1::ListWorkersResponse response;
  const absl::Status status = FromGrpcStatus(stub->ListWorkers(&context, v1::ListWorkersRequest(), &response));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;

  // The port is taken now.
  EmptyScheduler other;
  auto second = GrpcServer::Start({.address = (*server)->address()}, {{&other, ""}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);

  (*server)->Shutdown(1000);
  (*server)->Shutdown(1000);  // idempotent
  (*server)->Wait();
}

TEST(GrpcServerTest, RejectsNoServicesAndEmptyAddress) {
  EXPECT_EQ(GrpcServer::Start({.address = "127.0.0.1:0"}, std::span<const GrpcServiceEntry>()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EmptyScheduler service;
  EXPECT_EQ(GrpcServer::Start({.address = ""}, {{&service, ""}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrpcServerTest, RefusesAPortBeyond65535InsteadOfWrappingIt) {
  EmptyScheduler service;
  // 99999 would be narrowed to 34463 by gRPC.
  const absl::Status s = GrpcServer::Start({.address = "127.0.0.1:99999"}, {{&service, ""}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("port 99999 is out of range"), std::string::npos) << s;
}

TEST(GrpcServerTest, ReplacePort) {
  EXPECT_EQ(ReplacePort("0.0.0.0:0", 123), "0.0.0.0:123");
  EXPECT_EQ(ReplacePort("[::]:0", 9), "[::]:9");
  EXPECT_EQ(ReplacePort("localhost:50051", 7), "localhost:7");
  EXPECT_EQ(ReplacePort("unix", 7), "unix");
}

TEST(ChannelTest, WaitForConnectedTimesOutOnAClosedPort) {
  // Port 1 on loopback: nothing listens there in a test sandbox.
  auto channel = CreateChannel("127.0.0.1:1");
  EXPECT_EQ(WaitForConnected(*channel, 200).code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace kvmesh::rpc
