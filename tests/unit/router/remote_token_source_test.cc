#include "router/remote_token_source.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "metrics/registry.h"
#include "router/router_metrics.h"
#include "rpc/grpc_server.h"

namespace kvmesh::router {
namespace {

// A loopback port nothing listens on (bound, then closed): connecting is refused.
std::string ClosedAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// Places on the first worker of `workers` that the request does not exclude; records
// every request.
class FakeScheduler final : public v1::Scheduler::Service {
 public:
  struct Worker {
    std::string id;
    std::string address;
  };
  explicit FakeScheduler(std::vector<Worker> workers) : workers_(std::move(workers)) {}

  grpc::Status Place(grpc::ServerContext*, const v1::PlaceRequest* request, v1::PlaceResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(*request);
    for (const Worker& w : workers_) {
      const auto& excluded = request->exclude_worker_ids();
      if (std::find(excluded.begin(), excluded.end(), w.id) != excluded.end()) continue;
      response->mutable_decode_worker()->set_worker_id(w.id);
      response->mutable_decode_worker()->set_address(w.address);
      *response->mutable_prefill_worker() = response->decode_worker();
      response->set_prefill_locally(true);
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live worker serves the model");
  }

  std::vector<v1::PlaceRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  const std::vector<Worker> workers_;
  std::mutex mu_;
  std::vector<v1::PlaceRequest> requests_;
};

// Streams `tokens` (one message each, the last finishing with "length"), then ends
// with `status`; with `until_cancelled`, keeps streaming until the call is cancelled.
// From call number `healthy_from_call` on (when >= 0) it serves as a worker that
// resumes: `full` minus the request's resume_output_token_ids, then OK.
class FakeWorker final : public v1::Worker::Service {
 public:
  std::vector<int32_t> tokens = {5, 6, 7};
  grpc::Status status = grpc::Status::OK;
  bool until_cancelled = false;
  std::promise<void> cancelled;
  int32_t healthy_from_call = -1;
  std::vector<int32_t> full;

  std::vector<v1::WorkerGenerateRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  grpc::Status Generate(grpc::ServerContext* context, const v1::WorkerGenerateRequest* request,
                        grpc::ServerWriter<v1::WorkerGenerateResponse>* writer) override {
    int32_t call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      call = static_cast<int32_t>(requests_.size());
      requests_.push_back(*request);
    }
    if (healthy_from_call >= 0 && call >= healthy_from_call) {
      for (size_t i = static_cast<size_t>(request->resume_output_token_ids_size()); i < full.size(); ++i) {
        v1::WorkerGenerateResponse r;
        r.set_request_id(request->request_id());
        r.add_token_ids(full[i]);
        if (i + 1 == full.size()) r.set_finish_reason(v1::FINISH_REASON_LENGTH);
        writer->Write(r);
      }
      return grpc::Status::OK;
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      v1::WorkerGenerateResponse r;
      r.set_request_id(request->request_id());
      r.add_token_ids(tokens[i]);
      if (i == 0) r.set_num_prompt_tokens(request->prompt_token_ids_size());
      if (i + 1 == tokens.size() && status.ok() && !until_cancelled) r.set_finish_reason(v1::FINISH_REASON_LENGTH);
      writer->Write(r);
    }
    if (until_cancelled) {
      while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      cancelled.set_value();
      return grpc::Status::CANCELLED;
    }
    return status;
  }

 private:
  std::mutex mu_;
  std::vector<v1::WorkerGenerateRequest> requests_;
};

// Every output of one request, and its final one.
struct Outputs {
  std::mutex mu;
  std::vector<engine::RequestOutput> all;
  std::promise<engine::RequestOutput> final;

  std::function<void(const engine::RequestOutput&)> Callback() {
    return [this](const engine::RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu);
      all.push_back(out);
      if (out.finished) final.set_value(out);
    };
  }
  std::vector<int32_t> Tokens() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int32_t> ids;
    for (const auto& o : all) {
      for (const auto& c : o.outputs) ids.insert(ids.end(), c.new_token_ids.begin(), c.new_token_ids.end());
    }
    return ids;
  }
};

engine::EngineRequest Request(const std::string& id, Outputs& outputs) {
  engine::EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = {1, 2, 3};
  r.sampling_params.max_tokens = 3;
  r.on_output = outputs.Callback();
  return r;
}

RemoteTokenSourceOptions Options(const std::string& scheduler_address, int32_t max_attempts = 3) {
  RemoteTokenSourceOptions o;
  o.scheduler_address = scheduler_address;
  o.model = "m";
  o.limits.vocab_size = 100;
  o.limits.max_model_len = 64;
  o.limits.max_num_seqs = 4;
  o.limits.block_size_tokens = 16;
  o.limits.num_kv_blocks = 1000;
  o.max_attempts = max_attempts;
  o.place_timeout_ms = 5000;
  o.generate_timeout_ms = 10000;
  return o;
}

engine::RequestOutput Final(Outputs& outputs) {
  auto future = outputs.final.get_future();
  EXPECT_EQ(future.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  return future.get();
}

class RemoteTokenSourceTest : public ::testing::Test {
 protected:
  // Starts `worker` and a scheduler that places on `workers` (an empty address: the
  // fake worker's).
  void Start(std::vector<FakeScheduler::Worker> workers) {
    worker_server_ = rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{&worker_, "kvmesh.v1.Worker"}}).value();
    for (auto& w : workers) {
      if (w.address.empty()) w.address = worker_server_->address();
    }
    scheduler_ = std::make_unique<FakeScheduler>(std::move(workers));
    scheduler_server_ =
        rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{scheduler_.get(), "kvmesh.v1.Scheduler"}}).value();
    metrics_ = RouterMetrics::Create(registry_, [] { return 0.0; }).value();
  }

  // A draining decode worker ("draining") ends the call with `status` before any token:
  // the request must go to the other worker, and the client never sees the status.
  void ExpectPlacedAgainAfter(const grpc::Status& status) {
    worker_.tokens = {};
    worker_.status = status;
    worker_.healthy_from_call = 1;
    worker_.full = {5, 6, 7};
    Start({{"draining", ""}, {"other", ""}});
    Outputs outputs;
    const engine::RequestOutput final = RunOne(outputs);
    EXPECT_TRUE(final.status.ok()) << final.status;
    EXPECT_EQ(outputs.Tokens(), (std::vector<int32_t>{5, 6, 7}));
    ASSERT_EQ(scheduler_->requests().size(), 2u);
    EXPECT_EQ(scheduler_->requests()[1].exclude_worker_ids(0), "draining");
  }

  // Runs request "r1" to its final output through a source of its own.
  engine::RequestOutput RunOne(Outputs& outputs, int32_t max_attempts = 3) {
    RemoteTokenSource source(Options(scheduler_server_->address(), max_attempts), metrics_.get());
    EXPECT_TRUE(source.Submit(Request("r1", outputs)).ok());
    return Final(outputs);
  }

  double Metric(const std::string& line_prefix) {
    const std::string text = registry_.Exposition();
    const size_t at = text.find("\n" + line_prefix + " ");  // a sample line, not "# HELP ..."
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line_prefix.size() + 2));
  }

  FakeWorker worker_;
  std::unique_ptr<FakeScheduler> scheduler_;
  std::unique_ptr<rpc::GrpcServer> worker_server_;
  std::unique_ptr<rpc::GrpcServer> scheduler_server_;
  metrics::Registry registry_;
  std::unique_ptr<RouterMetrics> metrics_;
};

TEST_F(RemoteTokenSourceTest, StreamsTheWorkersTokensToAFinalOutput) {
  Start({{"w", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_TRUE(final.status.ok()) << final.status;
  EXPECT_EQ(outputs.Tokens(), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(final.num_prompt_tokens, 3);
  EXPECT_EQ(scheduler_->requests().size(), 1u);
  EXPECT_EQ(Metric("kvmesh_router_retries_total"), 0);
}

TEST_F(RemoteTokenSourceTest, AnUnreachableDecodeWorkerIsExcludedAndTheRequestPlacedAgain) {
  Start({{"dead", ClosedAddress()}, {"alive", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_TRUE(final.status.ok()) << final.status;
  EXPECT_EQ(outputs.Tokens(), (std::vector<int32_t>{5, 6, 7}));
  const std::vector<v1::PlaceRequest> places = scheduler_->requests();
  ASSERT_EQ(places.size(), 2u);
  EXPECT_TRUE(places[0].exclude_worker_ids().empty());
  ASSERT_EQ(places[1].exclude_worker_ids_size(), 1);
  EXPECT_EQ(places[1].exclude_worker_ids(0), "dead");
  EXPECT_EQ(Metric("kvmesh_router_retries_total"), 1);
  EXPECT_EQ(Metric("kvmesh_router_upstream_errors_total{stage=\"generate\",code=\"UNAVAILABLE\"}"), 1);
}

TEST_F(RemoteTokenSourceTest, RetriesStopAtMaxAttemptsWithTheWorkersError) {
  Start({{"dead-1", ClosedAddress()}, {"dead-2", ClosedAddress()}, {"alive", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs, /*max_attempts=*/2);
  EXPECT_EQ(final.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(final.status.message(), "dead-2")) << final.status;
  EXPECT_TRUE(absl::StrContains(final.status.message(), "2 placements")) << final.status;
  EXPECT_EQ(scheduler_->requests().size(), 2u);
  EXPECT_EQ(Metric("kvmesh_router_retries_total"), 1);
}

TEST_F(RemoteTokenSourceTest, WhenNoOtherWorkerRemainsTheUnreachableWorkersErrorIsReported) {
  Start({{"dead", ClosedAddress()}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_EQ(final.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(final.status.message(), "decode worker dead")) << final.status;
  EXPECT_TRUE(absl::StrContains(final.status.message(), "no other worker")) << final.status;
  EXPECT_EQ(Metric("kvmesh_router_upstream_errors_total{stage=\"place\",code=\"UNAVAILABLE\"}"), 1);
}

TEST_F(RemoteTokenSourceTest, AWorkerThatAnsweredUnavailableIsExcludedAndTheRequestPlacedAgain) {
  worker_.tokens = {};
  worker_.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "cannot serve now");
  worker_.healthy_from_call = 1;
  worker_.full = {5, 6, 7};
  Start({{"w", ""}, {"other", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_TRUE(final.status.ok()) << final.status;
  EXPECT_EQ(outputs.Tokens(), (std::vector<int32_t>{5, 6, 7}));
  const std::vector<v1::PlaceRequest> places = scheduler_->requests();
  ASSERT_EQ(places.size(), 2u);
  ASSERT_EQ(places[1].exclude_worker_ids_size(), 1);
  EXPECT_EQ(places[1].exclude_worker_ids(0), "w");
  EXPECT_EQ(worker_.requests()[1].resume_output_token_ids_size(), 0);  // nothing streamed: a plain retry
  EXPECT_EQ(Metric("kvmesh_router_retries_total"), 1);
}

TEST_F(RemoteTokenSourceTest, ARequestHandedBackByADrainingWorkerIsPlacedAgain) {
  ExpectPlacedAgainAfter(grpc::Status(grpc::StatusCode::ABORTED, "the worker is draining"));
}

// The draining worker's gRPC server cancelled the call as it shut down (CANCELLED that the
// router did not ask for; seen once in the fault suite's decode-sigterm case).
TEST_F(RemoteTokenSourceTest, ACallTheWorkersServerCancelledIsPlacedAgain) {
  ExpectPlacedAgainAfter(grpc::Status(grpc::StatusCode::CANCELLED, "the server is shutting down"));
}

// Migration: the decode worker died after streaming a token; the next one resumes from
// it, and the client's stream has every token once.
TEST_F(RemoteTokenSourceTest, AFailureAfterTokensStreamedMigratesTheRequestWithThoseTokens) {
  worker_.tokens = {9};
  worker_.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "socket closed");
  worker_.healthy_from_call = 1;
  worker_.full = {9, 10, 11};
  Start({{"w", ""}, {"other", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_TRUE(final.status.ok()) << final.status;
  EXPECT_EQ(outputs.Tokens(), (std::vector<int32_t>{9, 10, 11}));
  const std::vector<v1::WorkerGenerateRequest> generates = worker_.requests();
  ASSERT_EQ(generates.size(), 2u);
  ASSERT_EQ(generates[1].resume_output_token_ids_size(), 1);
  EXPECT_EQ(generates[1].resume_output_token_ids(0), 9);
  EXPECT_TRUE(generates[1].prefill_locally());
  EXPECT_EQ(generates[1].prompt_token_ids_size(), 3);  // the prompt itself is unchanged
  ASSERT_EQ(scheduler_->requests().size(), 2u);
  EXPECT_EQ(scheduler_->requests()[1].exclude_worker_ids(0), "w");
  ASSERT_EQ(final.outputs.size(), 1u);
  EXPECT_EQ(final.outputs[0].new_token_ids, (std::vector<int32_t>{11}));  // only the new one
}

TEST_F(RemoteTokenSourceTest, AnErrorOfTheRequestItselfAfterTokensIsNotMigratedAndSaysSo) {
  worker_.tokens = {9};
  worker_.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad request");
  worker_.healthy_from_call = 1;
  worker_.full = {9, 10, 11};
  Start({{"w", ""}, {"other", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs);
  EXPECT_EQ(final.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(final.status.message(), "after streaming tokens")) << final.status;
  EXPECT_TRUE(absl::StrContains(final.status.message(), "not migrated")) << final.status;
  EXPECT_EQ(outputs.Tokens(), std::vector<int32_t>{9});
  EXPECT_EQ(scheduler_->requests().size(), 1u);
}

TEST_F(RemoteTokenSourceTest, MigrationStopsAtMaxAttempts) {
  worker_.tokens = {9};
  worker_.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "socket closed");  // every call
  Start({{"a", ""}, {"b", ""}, {"c", ""}});
  Outputs outputs;
  const engine::RequestOutput final = RunOne(outputs, /*max_attempts=*/2);
  EXPECT_EQ(final.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(final.status.message(), "2 placements")) << final.status;
  EXPECT_EQ(scheduler_->requests().size(), 2u);
}

TEST_F(RemoteTokenSourceTest, AbortCancelsTheWorkersStreamAndEndsWithAbort) {
  worker_.until_cancelled = true;
  Start({{"w", ""}});
  RemoteTokenSource source(Options(scheduler_server_->address()), metrics_.get());
  Outputs outputs;
  ASSERT_TRUE(source.Submit(Request("r1", outputs)).ok());
  while (outputs.Tokens().size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  source.Abort("r1");
  const engine::RequestOutput final = Final(outputs);
  ASSERT_EQ(final.outputs.size(), 1u);
  EXPECT_EQ(final.outputs[0].finish_reason, engine::CompletionFinishReason::kAbort);
  EXPECT_EQ(worker_.cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(source.WaitIdle(5000));
  EXPECT_EQ(source.num_inflight(), 0);
  // A cancellation is the client's doing, not an upstream error.
  EXPECT_EQ(registry_.Exposition().find("kvmesh_router_upstream_errors_total{"), std::string::npos);
}

// Regression: an Abort racing a retry (Place() again after an unreachable decode
// worker) or a placement's answer made the call finish under its own lock, which
// deadlocked the gRPC thread and left the request in flight forever (seen as a router
// drain waiting on "inflight=1" after a worker died). Every request, aborted at any
// point, must end and leave nothing in flight.
TEST_F(RemoteTokenSourceTest, RequestsAbortedAtAnyPointAllEndAndLeaveNothingInFlight) {
  Start({{"dead", ClosedAddress()}, {"w", ""}});
  RemoteTokenSource source(Options(scheduler_server_->address()), metrics_.get());
  constexpr int kRequests = 60;
  std::vector<std::unique_ptr<Outputs>> outputs;
  for (int i = 0; i < kRequests; ++i) {
    outputs.push_back(std::make_unique<Outputs>());
    const std::string id = absl::StrCat("r", i);  // (not "r" + to_string: GCC 12 -Wrestrict false positive)
    ASSERT_TRUE(source.Submit(Request(id, *outputs.back())).ok());
    // Abort at spread-out points: at once, during the placement, during the retry.
    if (i % 3 != 2) {
      if (i % 3 == 1) std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 10)));
      source.Abort(id);
    }
  }
  for (auto& o : outputs) {
    auto future = o->final.get_future();
    ASSERT_EQ(future.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  }
  EXPECT_TRUE(source.WaitIdle(5000));
  EXPECT_EQ(source.num_inflight(), 0);
}

TEST_F(RemoteTokenSourceTest, DrainingRefusesNewRequestsAndDuplicateIdsAreRejected) {
  worker_.until_cancelled = true;
  Start({{"w", ""}});
  Outputs running;  // outlives the source, which delivers its final output on destruction
  RemoteTokenSource source(Options(scheduler_server_->address()), metrics_.get());
  ASSERT_TRUE(source.Submit(Request("r1", running)).ok());
  Outputs duplicate;
  EXPECT_EQ(source.Submit(Request("r1", duplicate)).code(), absl::StatusCode::kAlreadyExists);
  source.StartDraining();
  Outputs late;
  EXPECT_EQ(source.Submit(Request("r2", late)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(source.num_inflight(), 1);
  // A drain that outlives its deadline can say which stage holds each call.
  EXPECT_FALSE(source.WaitIdle(50));
  testing::internal::CaptureStderr();
  source.LogInflight();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("in-flight call"), std::string::npos) << log;
  EXPECT_NE(log.find("r1"), std::string::npos) << log;
  EXPECT_NE(log.find("stream=open or done"), std::string::npos) << log;
  // Destruction cancels what still runs and waits for its final output.
}

}  // namespace
}  // namespace kvmesh::router
