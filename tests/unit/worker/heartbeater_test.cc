// The Heartbeater against a fake scheduler on 127.0.0.1, over a real engine (a
// FakeKvStorageRunner on its AsyncEngine thread): KV events survive an engine that
// answers late and heartbeats that fail.
#include "worker/heartbeater.h"

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "fake_kv_storage_runner.h"
#include "rpc/grpc_server.h"
#include "rpc/kv_conversions.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;

// Registers everyone (heartbeats every 20 ms); fails the first `fail_heartbeats`
// heartbeats with UNAVAILABLE; records the others.
class FakeScheduler final : public v1::Scheduler::Service {
 public:
  explicit FakeScheduler(int fail_heartbeats) : fail_(fail_heartbeats) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse* response) override {
    response->set_heartbeat_interval_ms(20);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_ > 0) {
      --fail_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected");
    }
    accepted_.push_back(*request);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest*, v1::DeregisterResponse*) override {
    return grpc::Status::OK;
  }

  // Blocks stored on the worker per the accepted heartbeats (snapshots replace, deltas
  // apply), once some heartbeat with events arrived; -1 until then.
  int64_t IndexedBlocks() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t blocks = -1;
    for (const v1::HeartbeatRequest& h : accepted_) {
      if (h.kv_events_snapshot()) blocks = 0;
      for (const v1::KvEvent& e : h.kv_events()) {
        if (blocks < 0) blocks = 0;
        blocks += e.kind() == v1::KvEvent::KIND_STORED ? 1 : -1;
      }
    }
    return blocks;
  }

 private:
  std::mutex mu_;
  int fail_;
  std::vector<v1::HeartbeatRequest> accepted_;
};

struct Worker {
  Worker() : runner(kVocab, kBlockSize, /*num_blocks=*/32, /*num_layers=*/2) {
    engine::EngineOptions options;
    options.kv.block_size_tokens = kBlockSize;
    options.kv.record_events = true;
    options.max_model_len = 64;
    auto created = engine::Engine::Create(options, runner);
    EXPECT_TRUE(created.ok()) << created.status();
    const kv::KvBlockSpec block_spec = (*created)->kv_block_spec().value();
    async = std::make_unique<engine::AsyncEngine>(*std::move(created));
    state = std::make_unique<WorkerState>(*async, "w", v1::KvCacheSpec(), block_spec, std::vector<int32_t>{}, 30'000);
  }

  // Runs a 9-token prompt to its end: its 2 full blocks are stored in the prefix cache.
  void RunOneRequest() {
    std::promise<void> done;
    engine::EngineRequest r;
    r.request_id = "r";
    for (int32_t i = 0; i < 9; ++i) r.prompt_token_ids.push_back(1 + i);
    r.sampling_params.temperature = 0;
    r.sampling_params.max_tokens = 2;
    r.on_output = [&done](const engine::RequestOutput& out) {
      if (out.finished) done.set_value();
    };
    ASSERT_TRUE(async->Submit(std::move(r)).ok());
    done.get_future().wait();
  }

  engine::testing::FakeKvStorageRunner runner;
  std::unique_ptr<engine::AsyncEngine> async;
  std::unique_ptr<WorkerState> state;
};

int64_t IndexedBlocksEventually(FakeScheduler& scheduler) {
  for (int i = 0; i < 500; ++i) {
    if (const int64_t n = scheduler.IndexedBlocks(); n > 0) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return scheduler.IndexedBlocks();
}

v1::RegisterRequest Registration() {
  v1::RegisterRequest r;
  r.set_worker_id("w");
  r.set_address("127.0.0.1:1");
  return r;
}

// Regression: an engine answer that came after the heartbeat's wait gave up was dropped
// with the events it had drained, so the scheduler never learned of those blocks.
TEST(HeartbeaterTest, EventsOfAnEngineAnswerThatCameLateAreStillSent) {
  FakeScheduler scheduler(/*fail_heartbeats=*/0);
  auto server = rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{&scheduler, "kvmesh.v1.Scheduler"}}).value();
  Worker worker;
  worker.RunOneRequest();  // 2 stored events wait in the engine
  // Hold the engine thread so that the first heartbeat's wait (20 ms) gives up.
  absl::Notification release;
  worker.async->Post([&release](engine::Engine&) { release.WaitForNotification(); });
  Heartbeater heartbeater(*worker.state, server->address(), Registration(), /*health=*/nullptr,
                          /*engine_timeout_ms=*/20);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several give-ups
  release.Notify();
  EXPECT_EQ(IndexedBlocksEventually(scheduler), 2);
  heartbeater.Stop();
}

TEST(HeartbeaterTest, AfterFailedHeartbeatsASnapshotCarriesEveryStoredBlock) {
  FakeScheduler scheduler(/*fail_heartbeats=*/3);
  auto server = rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{&scheduler, "kvmesh.v1.Scheduler"}}).value();
  Worker worker;
  Heartbeater heartbeater(*worker.state, server->address(), Registration());
  worker.RunOneRequest();
  EXPECT_EQ(IndexedBlocksEventually(scheduler), 2);
  heartbeater.Stop();
}

}  // namespace
}  // namespace kvmesh::worker
