// Worker (libs/worker/worker.h) started from its options, as the worker binaries do,
// over engines with a fake KV-storage runner: a prefill and a decode worker on
// 127.0.0.1 serve a disaggregated request, then drain.
#include "worker/worker.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fake_kv_storage_runner.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "rpc/channel.h"

namespace kvmesh::worker {
namespace {

WorkerModel FakeModel() {
  WorkerModel model;
  model.runner = std::make_unique<engine::testing::FakeKvStorageRunner>(/*vocab_size=*/64, /*block_size_tokens=*/4,
                                                                         /*num_blocks=*/64, /*num_layers=*/3);
  model.engine.kv.block_size_tokens = 4;
  model.engine.max_model_len = 128;
  model.num_kv_heads = 1;
  return model;
}

WorkerOptions Options(v1::WorkerRole role) {
  WorkerOptions options;
  options.role = role;
  options.listen = "127.0.0.1:0";
  options.metrics_port = 0;
  options.kv_transport = KvTransportChoice::kGrpc;
  options.drain_timeout_ms = 1000;
  return options;
}

// Streams one greedy request from `decode`, prefilled on `prefill_address` ("": here).
grpc::Status Generate(const std::string& decode_address, const std::string& prefill_address,
                      std::vector<int32_t>* tokens) {
  auto stub = v1::Worker::NewStub(rpc::CreateChannel(decode_address));
  v1::WorkerGenerateRequest request;
  request.set_request_id("r");
  for (int32_t t = 1; t <= 10; ++t) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(5);
  request.mutable_sampling()->set_ignore_eos(true);
  request.set_prefill_worker_address(prefill_address);
  request.set_prefill_locally(prefill_address.empty());
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 20'000);
  auto reader = stub->Generate(&context, request);
  v1::WorkerGenerateResponse response;
  while (reader->Read(&response)) tokens->insert(tokens->end(), response.token_ids().begin(), response.token_ids().end());
  return reader->Finish();
}

TEST(WorkerTest, ServesADisaggregatedRequestThenDrainsAndStopsListening) {
  auto prefill = Worker::Start(Options(v1::WORKER_ROLE_PREFILL), FakeModel());
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  auto decode = Worker::Start(Options(v1::WORKER_ROLE_DECODE), FakeModel());
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ((*decode)->worker_id(), "worker-" + (*decode)->address());
  EXPECT_GT((*decode)->metrics_port(), 0);

  std::vector<int32_t> local, remote;
  ASSERT_TRUE(Generate((*decode)->address(), "", &local).ok());
  const grpc::Status s = Generate((*decode)->address(), (*prefill)->address(), &remote);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(local.size(), 5u);
  EXPECT_EQ(remote, local);

  const std::string address = (*decode)->address();
  (*decode)->Drain();
  (*decode)->Drain();  // once
  std::vector<int32_t> after;
  EXPECT_EQ(Generate(address, "", &after).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(after.empty());
}

TEST(WorkerTest, AnAddressThatCannotBeBoundIsAnErrorNotACrash) {
  WorkerOptions options = Options(v1::WORKER_ROLE_BOTH);
  options.listen = "203.0.113.1:1";  // TEST-NET-3: not an address of this host
  auto worker = Worker::Start(options, FakeModel());
  EXPECT_FALSE(worker.ok());
}

TEST(WorkerTest, AWorkerWithoutARunnerIsInvalidArgument) {
  auto worker = Worker::Start(Options(v1::WORKER_ROLE_BOTH), WorkerModel());
  ASSERT_FALSE(worker.ok());
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::worker
