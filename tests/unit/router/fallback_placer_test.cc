#include "router/fallback_placer.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kv/block_hash.h"
#include "rpc/channel.h"
#include "rpc/kv_conversions.h"

namespace kvmesh::router {
namespace {

constexpr int32_t kBlockSize = 4;

v1::WorkerStatus Worker(const std::string& id, v1::WorkerRole role, int32_t waiting = 0) {
  v1::WorkerStatus w;
  w.set_worker_id(id);
  w.set_address(id + ".local:1");
  w.set_role(role);
  w.set_model("m");
  w.mutable_kv_cache_spec()->set_block_size_tokens(kBlockSize);
  w.mutable_kv_cache_spec()->set_dtype(v1::KV_DTYPE_F32);
  w.mutable_kv_cache_spec()->set_tp_size(1);
  w.mutable_capacity()->set_max_num_seqs(8);
  w.mutable_load()->set_num_waiting_seqs(waiting);
  w.mutable_load()->set_kv_blocks_total(100);
  return w;
}

std::vector<int32_t> Prompt() {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 8 * kBlockSize + 1; ++i) tokens.push_back(100 + i);
  return tokens;
}

void IndexPrompt(v1::WorkerStatus& w) {
  for (const kv::BlockHash& h : kv::HashFullBlocks(Prompt(), kBlockSize, /*salt=*/0)) {
    v1::KvEvent* e = w.add_indexed_blocks();
    e->set_kind(v1::KvEvent::KIND_STORED);
    rpc::ToProto(h, e->mutable_block_hash());
    e->set_tier(v1::TIER_DEVICE);
    e->set_num_tokens(kBlockSize);
  }
}

v1::PlaceRequest Request(std::vector<std::string> exclude = {}) {
  v1::PlaceRequest r;
  r.set_request_id("r1");
  r.set_model("m");
  for (int32_t t : Prompt()) r.add_prompt_token_ids(t);
  for (const auto& id : exclude) r.add_exclude_worker_ids(id);
  return r;
}

TEST(FallbackPlacerTest, WithoutAViewPlaceIsUnavailable) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  EXPECT_EQ(placer.Place(Request()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(placer.num_workers(), 0);
}

TEST(FallbackPlacerTest, PlacesOnTheWorkerThatHoldsThePromptsPrefix) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse view;
  *view.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE);
  v1::WorkerStatus b = Worker("b", v1::WORKER_ROLE_DECODE);
  IndexPrompt(b);
  *view.add_workers() = b;
  ASSERT_EQ(placer.Update(view), absl::OkStatus());
  EXPECT_EQ(placer.num_workers(), 2);
  auto placed = placer.Place(Request());
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->decode_worker().worker_id(), "b");
  EXPECT_EQ(placed->decode_cached_tokens(), 8 * kBlockSize);
  EXPECT_NE(placed->reason().find("router fallback"), std::string::npos) << placed->reason();
}

TEST(FallbackPlacerTest, PlacesOnTheLessLoadedWorkerAndSpreadsABurst) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse view;
  *view.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE, /*waiting=*/6);
  *view.add_workers() = Worker("b", v1::WORKER_ROLE_DECODE, /*waiting=*/0);
  ASSERT_EQ(placer.Update(view), absl::OkStatus());
  auto first = placer.Place(Request());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->decode_worker().worker_id(), "b");
  // Provisional load: placements since the view was taken count, so a burst does not
  // all go to the worker that looked idlest.
  int on_a = 0;
  for (int i = 0; i < 16; ++i) on_a += placer.Place(Request())->decode_worker().worker_id() == "a";
  EXPECT_GT(on_a, 0);
}

TEST(FallbackPlacerTest, ExcludedWorkersAreNotChosenAndNoneLeftIsUnavailable) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse view;
  *view.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE);
  *view.add_workers() = Worker("p", v1::WORKER_ROLE_PREFILL);
  ASSERT_EQ(placer.Update(view), absl::OkStatus());
  EXPECT_EQ(placer.Place(Request({"a"})).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(placer.Place(Request({"p"}))->decode_worker().worker_id(), "a");
}

TEST(FallbackPlacerTest, ABadViewIsRefusedAndThePreviousOneKept) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse good;
  *good.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE);
  ASSERT_EQ(placer.Update(good), absl::OkStatus());
  v1::ListWorkersResponse bad;
  *bad.add_workers() = Worker("b", v1::WORKER_ROLE_DECODE);
  bad.mutable_workers(0)->mutable_kv_cache_spec()->set_block_size_tokens(0);
  EXPECT_EQ(placer.Update(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(placer.num_updates(), 1);
  EXPECT_EQ(placer.Place(Request())->decode_worker().worker_id(), "a");
}

TEST(FallbackPlacerTest, AViewWithoutDecodeWorkersDoesNotReplaceOneWithThem) {
  // A scheduler that just restarted answers with no workers until they re-register.
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse good;
  *good.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE);
  ASSERT_EQ(placer.Update(good), absl::OkStatus());
  ASSERT_TRUE(placer.Update(v1::ListWorkersResponse()).ok());
  EXPECT_EQ(placer.Place(Request())->decode_worker().worker_id(), "a");
  v1::ListWorkersResponse other;
  *other.add_workers() = Worker("b", v1::WORKER_ROLE_BOTH);
  ASSERT_TRUE(placer.Update(other).ok());
  EXPECT_EQ(placer.Place(Request())->decode_worker().worker_id(), "b");
}

TEST(FallbackPlacerTest, WorkersOfOtherModelsAreLeftOut) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 0}, nullptr);
  v1::ListWorkersResponse view;
  *view.add_workers() = Worker("a", v1::WORKER_ROLE_DECODE);
  view.mutable_workers(0)->set_model("other");
  ASSERT_EQ(placer.Update(view), absl::OkStatus());
  EXPECT_EQ(placer.num_workers(), 0);
  EXPECT_EQ(placer.Place(Request()).status().code(), absl::StatusCode::kUnavailable);
}

// A loopback port nothing listens on.
std::string ClosedAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

TEST(FallbackPlacerTest, FallsBackWhenTheSchedulerIsDownHungOrHasNoWorker) {
  EXPECT_TRUE(FallbackPlacer::ShouldFallBack(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "hung")));
  EXPECT_TRUE(FallbackPlacer::ShouldFallBack(grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused")));
  EXPECT_FALSE(FallbackPlacer::ShouldFallBack(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "x")));
  EXPECT_FALSE(FallbackPlacer::ShouldFallBack(grpc::Status::OK));
}

TEST(FallbackPlacerTest, ARefreshThreadAgainstADeadSchedulerKeepsNoViewAndStopsCleanly) {
  FallbackPlacer placer({.model = "m", .refresh_interval_ms = 10, .list_timeout_ms = 100},
                        rpc::CreateChannel(ClosedAddress()));
  EXPECT_EQ(placer.Place(Request()).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(placer.num_updates(), 0);
}

}  // namespace
}  // namespace kvmesh::router
