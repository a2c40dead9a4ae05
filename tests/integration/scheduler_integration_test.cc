// The real kvmesh-scheduler process on 127.0.0.1, driven by gRPC C++ clients: worker
// registration and heartbeats with KV events, cache-aware Place(), lease expiry,
// gRPC health and reflection, and a clean exit on SIGTERM.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "kv/block_hash.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/kv_conversions.h"
#include "rpc/status_conversion.h"

namespace kvmesh {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr uint64_t kSalt = 0x5eed;
constexpr int kHeartbeatMs = 100;
constexpr int kTtlMs = 1000;

// The scheduler child process: started with port 0, its port read from its log.
class SchedulerProcess {
 public:
  void Start() {
    process_.Start({KVMESH_SCHEDULER_BIN, "--listen=127.0.0.1:0", absl::StrCat("--heartbeat_interval_ms=", kHeartbeatMs),
                    absl::StrCat("--worker_ttl_ms=", kTtlMs), "--disaggregation-threshold-tokens=64",
                    "--shutdown_grace_ms=2000"},
                   "scheduler listening");
  }
  // SIGTERM, then the exit status (-1 if it had to be killed).
  int Stop() { return process_.Stop(); }
  std::string address() { return process_.address(); }
  std::string log() { return process_.log(); }

 private:
  testing::ChildProcess process_;
};

v1::RegisterRequest Registration(const std::string& id, v1::WorkerRole role) {
  v1::RegisterRequest request;
  request.set_worker_id(id);
  request.set_address(absl::StrCat(id, ".workers.local:7000"));
  request.set_role(role);
  request.set_model("tiny-llama");
  v1::KvCacheSpec* spec = request.mutable_kv_cache_spec();
  spec->set_block_size_tokens(kBlockSize);
  spec->set_num_layers(2);
  spec->set_num_kv_heads(4);
  spec->set_head_dim(64);
  spec->set_dtype(v1::KV_DTYPE_BF16);
  spec->set_tp_size(1);
  spec->set_block_hash_salt(kSalt);
  request.mutable_capacity()->set_max_num_seqs(64);
  return request;
}

std::vector<int32_t> Prompt(int32_t n, int32_t first) {
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class SchedulerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(scheduler_.Start());
    channel_ = rpc::CreateChannel(scheduler_.address());
    ASSERT_TRUE(rpc::WaitForConnected(*channel_, 10'000).ok());
    stub_ = v1::Scheduler::NewStub(channel_);
  }
  void TearDown() override {
    StopHeartbeats();
    // NOTE: clients leave first. gRPC's server shutdown waits (up to the grace period)
    // for connected clients to close after its GOAWAY, and a channel that served
    // synchronous calls here stays open until it is destroyed.
    stub_.reset();
    channel_.reset();
    EXPECT_EQ(scheduler_.Stop(), 0) << "scheduler did not exit cleanly on SIGTERM; log:\n" << scheduler_.log();
    const std::string log = scheduler_.log();
    if (std::getenv("KVMESH_TEST_VERBOSE") != nullptr) std::fputs(log.c_str(), stderr);
    EXPECT_NE(log.find("scheduler stopped"), std::string::npos) << log;
  }

  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response = nullptr) {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    v1::RegisterResponse ignored;
    return rpc::FromGrpcStatus(stub_->Register(&context, request, response ? response : &ignored));
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& request) {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    v1::HeartbeatResponse response;
    return rpc::FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
  }
  absl::StatusOr<v1::PlaceResponse> Place(const v1::PlaceRequest& request) {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    v1::PlaceResponse response;
    const absl::Status status = rpc::FromGrpcStatus(stub_->Place(&context, request, &response));
    if (!status.ok()) return status;
    return response;
  }
  v1::PlaceRequest PlaceTokens(const std::vector<int32_t>& tokens) {
    v1::PlaceRequest request;
    request.set_request_id("req");
    request.set_model("tiny-llama");
    request.mutable_prompt_token_ids()->Assign(tokens.begin(), tokens.end());
    return request;
  }
  std::vector<std::string> ListWorkerIds() {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    v1::ListWorkersResponse response;
    EXPECT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok());
    std::vector<std::string> ids;
    for (const auto& w : response.workers()) ids.push_back(w.worker_id());
    return ids;
  }

  // Heartbeats (empty) every kHeartbeatMs for `ids` from a background thread.
  void KeepAlive(std::set<std::string> ids) {
    {
      std::lock_guard<std::mutex> lock(alive_mu_);
      alive_ = std::move(ids);
    }
    if (heartbeats_.joinable()) return;
    heartbeats_ = std::thread([this] {
      auto stub = v1::Scheduler::NewStub(channel_);
      while (!stop_.load()) {
        std::set<std::string> ids;
        {
          std::lock_guard<std::mutex> lock(alive_mu_);
          ids = alive_;
        }
        for (const std::string& id : ids) {
          grpc::ClientContext context;
          rpc::SetTimeout(&context, 2000);
          v1::HeartbeatRequest request;
          request.set_worker_id(id);
          v1::HeartbeatResponse response;
          (void)stub->Heartbeat(&context, request, &response);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs));
      }
    });
  }
  void StopHeartbeats() {
    stop_ = true;
    if (heartbeats_.joinable()) heartbeats_.join();
  }

  SchedulerProcess scheduler_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::thread heartbeats_;
  std::atomic<bool> stop_{false};
  std::mutex alive_mu_;
  std::set<std::string> alive_;
};

TEST_F(SchedulerIntegrationTest, PlacesByPrefixOverlapAndDropsSilentWorkers) {
  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(Registration("decode-0", v1::WORKER_ROLE_DECODE), &registered).ok());
  EXPECT_EQ(registered.heartbeat_interval_ms(), static_cast<uint32_t>(kHeartbeatMs));
  EXPECT_EQ(registered.lease_ttl_ms(), static_cast<uint32_t>(kTtlMs));
  ASSERT_TRUE(Register(Registration("prefill-a", v1::WORKER_ROLE_PREFILL)).ok());
  ASSERT_TRUE(Register(Registration("prefill-b", v1::WORKER_ROLE_PREFILL)).ok());
  KeepAlive({"decode-0", "prefill-a", "prefill-b"});

  // prefill-b reports the first 40 blocks of the prompt as stored (as its KV manager would
  // hash them: same block size and salt), prefill-a some other prompt's blocks.
  const std::vector<int32_t> prompt = Prompt(1024, 1);
  const auto hashes = kv::HashFullBlocks(prompt, kBlockSize, kSalt);
  const auto other = kv::HashFullBlocks(Prompt(1024, 50'000), kBlockSize, kSalt);
  auto report = [&](const std::string& id, const std::vector<kv::BlockHash>& blocks, int n) {
    v1::HeartbeatRequest request;
    request.set_worker_id(id);
    request.mutable_load()->set_kv_blocks_total(1000);
    request.mutable_load()->set_kv_blocks_used(100);
    for (int i = 0; i < n; ++i) {
      rpc::ToProto(kv::KvEvent{.kind = kv::KvEvent::Kind::kStored,
                               .block_hash = blocks[i],
                               .parent_hash = i == 0 ? kv::kRootBlockHash : blocks[i - 1],
                               .tier = kv::Tier::kDevice,
                               .num_tokens = kBlockSize},
                   request.add_kv_events());
    }
    return Heartbeat(request);
  };
  ASSERT_TRUE(report("prefill-b", hashes, 40).ok());
  ASSERT_TRUE(report("prefill-a", other, 60).ok());

  auto placement = Place(PlaceTokens(prompt));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->prefill_worker().worker_id(), "prefill-b") << placement->reason();
  EXPECT_EQ(placement->prefill_worker().address(), "prefill-b.workers.local:7000");
  EXPECT_EQ(placement->decode_worker().worker_id(), "decode-0");
  EXPECT_FALSE(placement->prefill_locally());
  EXPECT_EQ(placement->prefill_cached_tokens(), 40 * kBlockSize);

  // The same through block hashes.
  v1::PlaceRequest by_hash;
  by_hash.set_model("tiny-llama");
  by_hash.set_prompt_length_tokens(static_cast<int32_t>(prompt.size()));
  for (const auto& h : hashes) rpc::ToProto(h, by_hash.add_prompt_block_hashes());
  placement = Place(by_hash);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->prefill_worker().worker_id(), "prefill-b");

  // A short prompt is prefilled on the decode worker (threshold 64 tokens).
  placement = Place(PlaceTokens(Prompt(40, 1)));
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->prefill_locally());
  EXPECT_EQ(placement->prefill_worker().worker_id(), "decode-0");

  // prefill-b stops heartbeating: after the TTL it is gone from placement and listing.
  KeepAlive({"decode-0", "prefill-a"});
  std::this_thread::sleep_for(std::chrono::milliseconds(kTtlMs + 600));
  placement = Place(PlaceTokens(prompt));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->prefill_worker().worker_id(), "prefill-a");
  EXPECT_EQ(ListWorkerIds(), (std::vector<std::string>{"decode-0", "prefill-a"}));
  v1::HeartbeatRequest late;
  late.set_worker_id("prefill-b");
  EXPECT_EQ(Heartbeat(late).code(), absl::StatusCode::kNotFound);
  EXPECT_NE(scheduler_.log().find("worker expired worker=prefill-b"), std::string::npos) << scheduler_.log();
}

TEST_F(SchedulerIntegrationTest, ListWorkersHandsOutIndexedBlocksWhenAskedBounded) {
  // The router's fallback view (libs/router/fallback_placer.h) is built from this.
  ASSERT_TRUE(Register(Registration("decode-0", v1::WORKER_ROLE_DECODE)).ok());
  const auto hashes = kv::HashFullBlocks(Prompt(160, 1), kBlockSize, kSalt);
  v1::HeartbeatRequest request;
  request.set_worker_id("decode-0");
  for (size_t i = 0; i < hashes.size(); ++i) {
    rpc::ToProto(kv::KvEvent{.kind = kv::KvEvent::Kind::kStored,
                             .block_hash = hashes[i],
                             .parent_hash = i == 0 ? kv::kRootBlockHash : hashes[i - 1],
                             .tier = kv::Tier::kDevice,
                             .num_tokens = kBlockSize},
                 request.add_kv_events());
  }
  ASSERT_TRUE(Heartbeat(request).ok());
  auto list = [&](int32_t max_blocks) {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    v1::ListWorkersRequest list_request;
    list_request.set_max_indexed_blocks_per_worker(max_blocks);
    v1::ListWorkersResponse response;
    EXPECT_TRUE(stub_->ListWorkers(&context, list_request, &response).ok());
    EXPECT_EQ(response.workers_size(), 1);
    return response.workers_size() == 1 ? response.workers(0) : v1::WorkerStatus();
  };
  EXPECT_EQ(list(0).indexed_blocks_size(), 0);  // not asked: none
  const v1::WorkerStatus all = list(1000);
  EXPECT_EQ(all.num_indexed_blocks(), static_cast<int64_t>(hashes.size()));
  ASSERT_EQ(all.indexed_blocks_size(), static_cast<int>(hashes.size()));
  std::set<std::pair<uint64_t, uint64_t>> got, want;
  for (const auto& e : all.indexed_blocks()) {
    EXPECT_EQ(e.kind(), v1::KvEvent::KIND_STORED);
    EXPECT_EQ(e.tier(), v1::TIER_DEVICE);
    got.insert({e.block_hash().low(), e.block_hash().high()});
  }
  for (const auto& h : hashes) {
    v1::BlockHash proto;
    rpc::ToProto(h, &proto);
    want.insert({proto.low(), proto.high()});
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(list(3).indexed_blocks_size(), 3);
}

TEST_F(SchedulerIntegrationTest, ErrorsAreClearStatuses) {
  // No worker for the model.
  EXPECT_EQ(Place(PlaceTokens(Prompt(100, 1))).status().code(), absl::StatusCode::kUnavailable);
  // Unknown worker.
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("nobody");
  EXPECT_EQ(Heartbeat(heartbeat).code(), absl::StatusCode::kNotFound);
  // Bad registrations.
  v1::RegisterRequest bad = Registration("w", v1::WORKER_ROLE_UNSPECIFIED);
  EXPECT_EQ(Register(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Registration("w", v1::WORKER_ROLE_BOTH);
  bad.mutable_kv_cache_spec()->set_dtype(v1::KV_DTYPE_UNSPECIFIED);
  EXPECT_EQ(Register(bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Register(Registration("w", v1::WORKER_ROLE_BOTH)).ok());
  bad = Registration("w2", v1::WORKER_ROLE_BOTH);
  bad.mutable_kv_cache_spec()->set_block_size_tokens(32);
  EXPECT_EQ(Register(bad).code(), absl::StatusCode::kFailedPrecondition);
  // A malformed KV event.
  heartbeat.set_worker_id("w");
  heartbeat.add_kv_events();  // kind and tier unspecified
  EXPECT_EQ(Heartbeat(heartbeat).code(), absl::StatusCode::kInvalidArgument);
  // No prompt.
  v1::PlaceRequest empty;
  empty.set_model("tiny-llama");
  EXPECT_EQ(Place(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerIntegrationTest, HealthReportsServing) {
  grpc::GenericStub generic(channel_);
  // grpc.health.v1.HealthCheckRequest{service} -> HealthCheckResponse{status}; SERVING = 1.
  for (const std::string& service : {std::string(), std::string("kvmesh.v1.Scheduler")}) {
    std::string request;
    if (!service.empty()) {
      request.push_back(0x0a);
      request.push_back(static_cast<char>(service.size()));
      request += service;
    }
    const grpc::ByteBuffer request_buffer = ToBuffer(request);
    grpc::ByteBuffer response_buffer;
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 5000);
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                      &response_buffer, [&](grpc::Status status) { done.set_value(status); });
    const grpc::Status status = done.get_future().get();
    ASSERT_TRUE(status.ok()) << status.error_message() << " for service \"" << service << "\"";
    EXPECT_EQ(ToString(response_buffer), std::string("\x08\x01", 2)) << "service \"" << service << "\"";
  }
}

// A grpc.reflection.v1alpha list_services exchange, with hand-encoded messages (the
// reflection protos are not installed for clients).
class ListServicesReactor final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ListServicesReactor(grpc::GenericStub* stub) {
    rpc::SetTimeout(&context_, 5000);
    request_ = ToBuffer(std::string("\x3a\x01*", 3));  // list_services = "*" (field 7)
    stub->PrepareBidiStreamingCall(&context_, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool /*ok*/) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    bytes_ = ToString(response_);
  }
  void OnDone(const grpc::Status& status) override { done_.set_value(status); }
  grpc::Status Await() { return done_.get_future().get(); }
  const std::string& bytes() const { return bytes_; }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::string bytes_;
  std::promise<grpc::Status> done_;
};

TEST_F(SchedulerIntegrationTest, ReflectionListsTheServices) {
  grpc::GenericStub generic(channel_);
  ListServicesReactor reactor(&generic);
  const grpc::Status status = reactor.Await();
  ASSERT_TRUE(status.ok()) << status.error_message();
  // ServerReflectionResponse.list_services_response (6) -> service (1) -> name (1).
  google::protobuf::UnknownFieldSet response;
  ASSERT_TRUE(response.ParseFromString(reactor.bytes()));
  std::set<std::string> names;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      for (int k = 0; k < service.field_count(); ++k) names.insert(service.field(k).length_delimited());
    }
  }
  EXPECT_TRUE(names.contains("kvmesh.v1.Scheduler")) << reactor.bytes();
  EXPECT_TRUE(names.contains("grpc.health.v1.Health"));
  EXPECT_TRUE(names.contains("grpc.reflection.v1alpha.ServerReflection"));
}

}  // namespace
}  // namespace kvmesh
