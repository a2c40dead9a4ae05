#include "router/router.h"

#include <gtest/gtest.h>

namespace kvmesh::router {
namespace {

RouterOptions Options() {
  RouterOptions o;
  o.model_dir = KVMESH_TINY_MODEL_DIR;
  o.scheduler_address = "127.0.0.1:1";  // never called: no request is sent
  o.port = 0;
  o.grpc_port = 0;
  return o;
}

TEST(RouterTest, StartsBothServersOnFreePortsAndDrainsAtOnceWhenIdle) {
  auto router = Router::Start(Options());
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_GT((*router)->http_port(), 0);
  EXPECT_GT((*router)->grpc_port(), 0);
  EXPECT_EQ((*router)->model_name(), "tiny-llama");  // the model directory's name
  EXPECT_EQ((*router)->num_inflight(), 0);
  EXPECT_TRUE((*router)->Drain(/*timeout_ms=*/1000));
}

TEST(RouterTest, GrpcPortMinusOneRunsRestOnly) {
  RouterOptions o = Options();
  o.grpc_port = -1;
  o.served_model_name = "served-name";
  auto router = Router::Start(o);
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_EQ((*router)->grpc_port(), -1);
  EXPECT_EQ((*router)->model_name(), "served-name");
}

TEST(RouterTest, BadOptionsAreInvalidArgument) {
  RouterOptions o = Options();
  o.scheduler_address.clear();
  EXPECT_EQ(Router::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.grpc_port = -2;
  EXPECT_EQ(Router::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.max_attempts = 0;
  EXPECT_EQ(Router::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.model_dir = "/nonexistent/model";
  EXPECT_FALSE(Router::Start(o).ok());
}

}  // namespace
}  // namespace kvmesh::router
