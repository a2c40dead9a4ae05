// The Worker service's own error paths and the disaggregated flow over real gRPC on
// 127.0.0.1: engines run a FakeKvStorageRunner (a real KvStorage, so blocks really move)
// on their AsyncEngine threads; a fake prefill service stands in where the test needs a
// peer that never answers.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "kv/transport/ucx/cma_put.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "fake_kv_storage_runner.h"
#include "metrics/registry.h"
#include "rpc/channel.h"
#include "rpc/grpc_server.h"
#include "rpc/kv_conversions.h"
#include "worker/kv_transfer_metrics.h"
#include "worker/worker_service.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kNumBlocks = 64;

// One worker: an engine over a fake runner, its Worker service on 127.0.0.1.
struct Worker {
  explicit Worker(int64_t lease_timeout_ms = 30'000)
      : runner(kVocab, kBlockSize, kNumBlocks, /*num_layers=*/3) {
    engine::EngineOptions options;
    options.kv.block_size_tokens = kBlockSize;
    options.max_model_len = 128;
    options.scheduler.max_num_batched_tokens = 8;  // chunked prefill: several steps a prompt
    options.lease_timeout_ms = lease_timeout_ms;
    options.prefill_release_timeout_ms = lease_timeout_ms;
    auto created = engine::Engine::Create(options, runner);
    EXPECT_TRUE(created.ok()) << created.status();
    block_spec = (*created)->kv_block_spec().value();
    spec.set_block_size_tokens(block_spec.block_size_tokens);
    spec.set_num_layers(block_spec.num_layers);
    spec.set_num_kv_heads(1);
    spec.set_head_dim(block_spec.head_dim);
    spec.set_dtype(rpc::KvDtypeToProto(block_spec.dtype).value());
    spec.set_tp_size(1);
    spec.set_block_hash_salt(options.kv.salt);
    async = std::make_unique<engine::AsyncEngine>(*std::move(created));
    state = std::make_unique<WorkerState>(*async, "w", spec, block_spec, std::vector<int32_t>{}, lease_timeout_ms);
    transfer_metrics = KvTransferMetrics::Create(registry).value();
    state->SetMetrics(nullptr, transfer_metrics.get());
    service = std::make_unique<WorkerService>(*state);
    server = rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{service.get(), v1::Worker::service_full_name()}})
                 .value();
    state->SetIdentity("worker-" + server->address(), server->address());
    stub = v1::Worker::NewStub(rpc::CreateChannel(server->address()));
  }
  // The production order (Worker::Drain, worker.cc): no call running, the worker's own calls to
  // its peers ended (their completions post to the engine), then the engine.
  ~Worker() {
    server->Shutdown(0);
    state->outgoing_calls().CancelAllAndWait();
    ucx.reset();
    async.reset();
  }

  // KV blocks held by requests (not counting free or cached ones), once the engine has
  // settled (polls: outputs travel through other threads).
  int32_t UsedBlocksEventually() {
    for (int i = 0; i < 200; ++i) {
      const engine::EngineStats s = async->stats();
      if (s.num_kv_blocks_used == 0 && s.num_unfinished_requests == 0) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return async->stats().num_kv_blocks_used;
  }

  // Grants a lease for `prompt` on this (decode) worker and registers it for pushes as
  // `transfer_id`, as GenerateCall does.
  engine::RemotePrefillLease OpenLease(const std::string& transfer_id, std::vector<int32_t> prompt) {
    std::promise<absl::StatusOr<engine::RemotePrefillLease>> granted;
    engine::EngineRequest r;
    r.request_id = "lease-" + transfer_id;
    r.prompt_token_ids = std::move(prompt);
    r.sampling_params.temperature = 0;
    r.sampling_params.max_tokens = 4;
    // Through SubmitWith, as GenerateCall does, so that the AsyncEngine tracks (and at
    // the end aborts) the request.
    const absl::Status submitted =
        async->SubmitWith(std::move(r), [&granted](engine::Engine& e, engine::EngineRequest req) -> absl::Status {
          absl::StatusOr<engine::RemotePrefillLease> lease = e.ReserveForRemotePrefill(std::move(req));
          const absl::Status s = lease.status();
          granted.set_value(std::move(lease));
          return s;
        });
    EXPECT_TRUE(submitted.ok()) << submitted;
    absl::StatusOr<engine::RemotePrefillLease> lease = granted.get_future().get();
    EXPECT_TRUE(lease.ok()) << lease.status();
    WorkerState::Lease entry{.id = lease->transfer_id, .index_of_block = {}};
    for (int32_t i = lease->num_cached_blocks(); i < lease->num_blocks(); ++i) {
      entry.index_of_block[lease->block_ids[i].value] = i;
    }
    state->AddLease(transfer_id, std::move(entry));
    return *lease;
  }

  std::string Metrics() const { return registry.Exposition(); }

  // Moves this worker's KV over `transport`, registered over its pool as Worker::StartUcx
  // does; the worker drops it where Worker::Drain does (after its calls, before its engine).
  kv::UcxKvTransport& UseUcx(std::unique_ptr<kv::UcxKvTransport> transport) {
    ucx = std::move(transport);
    kv::KvStorage* storage = runner.kv_storage();
    const kv::KvPoolHandle pool = ucx->RegisterPool(storage->data(), storage->layout()).value();
    state->SetKvTransports(
        {{.pool = {.transport = ucx.get(), .pool = pool}, .base = storage->data(), .layout = storage->layout()}});
    return *ucx;
  }

  engine::testing::FakeKvStorageRunner runner;
  kv::KvBlockSpec block_spec;
  v1::KvCacheSpec spec;
  std::unique_ptr<engine::AsyncEngine> async;
  metrics::Registry registry;
  std::unique_ptr<KvTransferMetrics> transfer_metrics;
  std::unique_ptr<WorkerState> state;
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<rpc::GrpcServer> server;
  std::unique_ptr<kv::UcxKvTransport> ucx;  // UseUcx
  std::unique_ptr<v1::Worker::Stub> stub;
};

v1::KvBlockChunk Chunk(const std::string& transfer_id, int32_t layer, const std::vector<int32_t>& block_ids,
                       int64_t block_bytes) {
  v1::KvBlockChunk chunk;
  chunk.set_transfer_id(transfer_id);
  chunk.set_layer(layer);
  for (int32_t b : block_ids) chunk.add_block_ids(b);
  chunk.set_payload(std::string(static_cast<size_t>(block_bytes) * block_ids.size(), '\x01'));
  chunk.set_checksum_xxh64(XXH64(chunk.payload().data(), chunk.payload().size(), 0));
  return chunk;
}

grpc::Status Push(v1::Worker::Stub& stub, const std::vector<v1::KvBlockChunk>& chunks) {
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 10'000);
  v1::KvPushAck ack;
  std::unique_ptr<grpc::ClientWriter<v1::KvBlockChunk>> writer = stub.PushKvBlocks(&context, &ack);
  for (const v1::KvBlockChunk& c : chunks) {
    if (!writer->Write(c)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

std::vector<int32_t> Prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(2 + (seed * 7 + i * 13) % (kVocab - 2));
  return p;
}

TEST(WorkerServiceTest, PushWithACorruptChecksumFailsWithDataLossAndCountsAFailure) {
  Worker decode;
  const engine::RemotePrefillLease lease = decode.OpenLease("t1", Prompt(10, 1));
  v1::KvBlockChunk chunk = Chunk("t1", 0, {lease.block_ids[0].value}, decode.block_spec.block_bytes);
  chunk.set_checksum_xxh64(chunk.checksum_xxh64() + 1);
  EXPECT_EQ(Push(*decode.stub, {chunk}).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(decode.Metrics(), testing::HasSubstr("kvmesh_kv_transfer_failures_total{direction=\"received\"} 1"));
}

TEST(WorkerServiceTest, PushToAnUnknownTransferIsNotFound) {
  Worker decode;
  decode.OpenLease("t1", Prompt(10, 1));
  EXPECT_EQ(Push(*decode.stub, {Chunk("no-such-transfer", 0, {0}, decode.block_spec.block_bytes)}).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(WorkerServiceTest, PushOfABlockOutsideTheDestinationIsInvalidArgument) {
  Worker decode;
  const engine::RemotePrefillLease lease = decode.OpenLease("t1", Prompt(10, 1));
  int32_t foreign = 0;
  while (std::find(lease.block_ids.begin(), lease.block_ids.end(), kv::BlockId{foreign}) != lease.block_ids.end()) {
    ++foreign;
  }
  EXPECT_EQ(Push(*decode.stub, {Chunk("t1", 0, {foreign}, decode.block_spec.block_bytes)}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(WorkerServiceTest, PushOfAPayloadOfTheWrongSizeIsDataLoss) {
  Worker decode;
  const engine::RemotePrefillLease lease = decode.OpenLease("t1", Prompt(10, 1));
  v1::KvBlockChunk chunk = Chunk("t1", 0, {lease.block_ids[0].value}, decode.block_spec.block_bytes);
  chunk.mutable_payload()->pop_back();
  chunk.set_checksum_xxh64(XXH64(chunk.payload().data(), chunk.payload().size(), 0));
  EXPECT_EQ(Push(*decode.stub, {chunk}).error_code(), grpc::StatusCode::DATA_LOSS);
}

TEST(WorkerServiceTest, PrefillWithAnotherKvSpecIsInvalidArgumentAndQueuesNothing) {
  Worker prefill;
  v1::PrefillRequest request;
  request.set_request_id("r");
  for (int32_t t : Prompt(10, 2)) request.add_prompt_token_ids(t);
  v1::KvDestination* dest = request.mutable_destination();
  dest->set_decode_worker_address("127.0.0.1:1");
  dest->set_transfer_id("t");
  *dest->mutable_kv_cache_spec() = prefill.spec;
  dest->mutable_kv_cache_spec()->set_head_dim(prefill.spec.head_dim() * 2);
  dest->add_blocks_per_rank()->add_block_ids(0);
  grpc::ClientContext context;
  v1::PrefillResponse response;
  const grpc::Status s = prefill.stub->Prefill(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), testing::HasSubstr("kv_cache_spec"));
  EXPECT_EQ(prefill.async->stats().num_unfinished_requests, 0);
}

// What a fake peer saw of one kind of call.
struct CallWatch {
  std::promise<void> received;
  std::promise<void> cancelled;
};

// A reactor that never answers: it only notices being cancelled.
template <typename Base>  // grpc::ServerUnaryReactor, grpc::ServerReadReactor<...>
class WaitForCancelReactor : public Base {
 public:
  explicit WaitForCancelReactor(CallWatch& watch) : watch_(watch) { watch_.received.set_value(); }
  void OnCancel() override {
    watch_.cancelled.set_value();
    this->Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  CallWatch& watch_;
};

// A peer that takes one Prefill and one PushKvBlocks and never answers either.
class SilentPeerService final : public v1::Worker::CallbackService {
 public:
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext*, const v1::PrefillRequest*,
                                    v1::PrefillResponse*) override {
    return new WaitForCancelReactor<grpc::ServerUnaryReactor>(prefill);
  }
  grpc::ServerReadReactor<v1::KvBlockChunk>* PushKvBlocks(grpc::CallbackServerContext*, v1::KvPushAck*) override {
    return new WaitForCancelReactor<grpc::ServerReadReactor<v1::KvBlockChunk>>(push);
  }
  CallWatch prefill;
  CallWatch push;
};

struct SilentPeer {
  SilentPeer()
      : server(rpc::GrpcServer::Start({.address = "127.0.0.1:0"}, {{&service, v1::Worker::service_full_name()}})
                   .value()) {}
  SilentPeerService service;
  std::unique_ptr<rpc::GrpcServer> server;
};

v1::WorkerGenerateRequest GenerateRequest(const std::string& id, std::vector<int32_t> prompt,
                                          const std::string& prefill_address, int32_t max_tokens = 6) {
  v1::WorkerGenerateRequest request;
  request.set_request_id(id);
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  request.set_prefill_worker_address(prefill_address);
  request.set_prefill_locally(prefill_address.empty());
  return request;
}

// The Prefill call's deadline is capped by the lease's, so when a silent prefill peer
// lets the lease run out, either the call's deadline fires first (the decode worker
// falls back to a local prefill: tokens) or the lease expiry does (DeadlineExceeded).
// Which one wins is a race of two 300 ms timers; both must free the lease's blocks and
// cancel the remote prefill.
TEST(WorkerServiceTest, AnExpiredLeaseEndsTheRequestWithDeadlineExceededAndFreesItsBlocks) {
  SilentPeer prefill;
  Worker decode(/*lease_timeout_ms=*/300);
  grpc::ClientContext context;
  auto reader = decode.stub->Generate(&context, GenerateRequest("r", Prompt(10, 3), prefill.server->address()));
  v1::WorkerGenerateResponse response;
  int32_t tokens = 0;
  while (reader->Read(&response)) {
    tokens += response.token_ids_size();
  }
  const grpc::StatusCode code = reader->Finish().error_code();
  EXPECT_TRUE(code == grpc::StatusCode::DEADLINE_EXCEEDED || (code == grpc::StatusCode::OK && tokens == 6))
      << "status " << code << " after " << tokens << " tokens";
  EXPECT_EQ(decode.UsedBlocksEventually(), 0);
  EXPECT_EQ(prefill.service.prefill.cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the prefill call outlived its lease";
}

TEST(WorkerServiceTest, AClientLeavingMidPrefillCancelsTheRemotePrefillAndFreesTheLease) {
  SilentPeer prefill;
  Worker decode;
  grpc::ClientContext context;
  auto reader = decode.stub->Generate(&context, GenerateRequest("r", Prompt(10, 4), prefill.server->address()));
  ASSERT_EQ(prefill.service.prefill.received.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  context.TryCancel();
  EXPECT_EQ(prefill.service.prefill.cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the decode side did not cancel the remote prefill";
  EXPECT_EQ(decode.UsedBlocksEventually(), 0);
}

// With a UCX lease offered, a request that ends first (its client left) closes the lease
// and cancels the Prefill call itself: neither event is the prefill worker's failure, so
// the scheduler must not hear it is unreachable (it would get no placements for
// --unreachable-ttl-ms, and every prompt would be prefilled on its decode worker).
TEST(WorkerServiceTest, AClientLeavingMidUcxPrefillReportsNoPeerUnreachable) {
  SilentPeer prefill;
  Worker decode;
  kv::UcxKvTransport* ucx = &decode.UseUcx(kv::UcxKvTransport::Create({.tls = "tcp"}).value());
  std::mutex mu;
  std::vector<std::string> reports;
  decode.state->SetUnreachableReporter([&](const std::string& address, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(absl::StrCat(address, ": ", reason));
  });
  grpc::ClientContext context;
  auto reader = decode.stub->Generate(&context, GenerateRequest("r", Prompt(10, 6), prefill.server->address()));
  ASSERT_EQ(prefill.service.prefill.received.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // The lease is registered on the transport's thread: wait for it (the offer is sure
  // once the count shows it; a check at once raced that thread on a loaded machine).
  for (int i = 0; i < 1000 && ucx->num_open_leases() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(ucx->num_open_leases(), 1) << "the decode worker offered no UCX lease";
  context.TryCancel();
  EXPECT_EQ(prefill.service.prefill.cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(decode.UsedBlocksEventually(), 0);
  // Both events have been handled once the Prefill call's registration and the lease are
  // gone; the lease's callback runs right after its removal, on the transport's thread.
  for (int i = 0; i < 200 && (decode.state->outgoing_calls().num_open() > 0 || ucx->num_open_leases() > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(decode.state->outgoing_calls().num_open(), 0);
  EXPECT_EQ(ucx->num_open_leases(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(reports, ::testing::IsEmpty());
}

TEST(WorkerServiceTest, ACancelledPrefillStopsItsPushAndKeepsNoBlocks) {
  Worker prefill;
  SilentPeer receiver;
  v1::PrefillRequest request;
  request.set_request_id("r");
  const std::vector<int32_t> prompt = Prompt(10, 5);
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(4);
  v1::KvDestination* dest = request.mutable_destination();
  dest->set_decode_worker_address(receiver.server->address());
  dest->set_transfer_id("t");
  *dest->mutable_kv_cache_spec() = prefill.spec;
  v1::RankBlocks* blocks = dest->add_blocks_per_rank();
  for (int32_t b = 0; b < (10 + kBlockSize - 1) / kBlockSize; ++b) blocks->add_block_ids(b);
  grpc::ClientContext context;
  v1::PrefillResponse response;
  grpc::Status status;
  std::thread call([&] { status = prefill.stub->Prefill(&context, request, &response); });
  ASSERT_EQ(receiver.service.push.received.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  context.TryCancel();
  call.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(receiver.service.push.cancelled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the prefill worker kept its KV push open";
  EXPECT_EQ(prefill.UsedBlocksEventually(), 0);
}

std::vector<int32_t> GenerateTokens(Worker& decode, const v1::WorkerGenerateRequest& request, grpc::Status* status) {
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 20'000);
  auto reader = decode.stub->Generate(&context, request);
  std::vector<int32_t> tokens;
  v1::WorkerGenerateResponse response;
  while (reader->Read(&response)) tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
  *status = reader->Finish();
  return tokens;
}

// A run corrupted on its way into the decode worker's pool (here one byte, flipped
// between the sender's checksum and its cross-memory-attach write) is refused end to
// end with the transports as the worker builds them: the lease fails with DataLoss,
// the decode worker prefills the request itself and streams the tokens a local
// prefill gives, and every block comes back (the failed lease's once its sender said
// it writes no more).
TEST(WorkerServiceTest, AUcxRunCorruptedOnItsWayIsRefusedAndTheRequestIsPrefilledLocally) {
  Worker prefill, decode, local;
  kv::UcxKvTransportOptions production;  // checksum_runs as the worker has it
  production.tls = "sm";
  kv::UcxKvTransportOptions corrupting = production;
  corrupting.cma_write = [](pid_t pid, const std::byte* src, size_t bytes, uint64_t remote) {
    std::vector<std::byte> copy(src, src + bytes);
    copy[bytes / 2] ^= std::byte{0x01};
    return kv::CmaWrite(pid, copy.data(), bytes, remote);
  };
  decode.UseUcx(kv::UcxKvTransport::Create(production).value());
  prefill.UseUcx(kv::UcxKvTransport::Create(corrupting).value());
  const std::vector<int32_t> prompt = Prompt(23, 7);
  grpc::Status local_status;
  const std::vector<int32_t> want = GenerateTokens(local, GenerateRequest("l", prompt, ""), &local_status);
  ASSERT_TRUE(local_status.ok()) << local_status.error_message();
  grpc::Status status;
  const std::vector<int32_t> got =
      GenerateTokens(decode, GenerateRequest("r", prompt, prefill.server->address()), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode.async->stats().num_remote_prefill_fallbacks, 1) << "the corrupted KV was not refused";
  EXPECT_EQ(decode.UsedBlocksEventually(), 0);
  EXPECT_EQ(prefill.UsedBlocksEventually(), 0);
  EXPECT_EQ(decode.async->stats().num_kv_blocks_quarantined, 0);
}

TEST(WorkerServiceTest, DisaggregatedGenerateStreamsTheKvAndMatchesALocalPrefill) {
  Worker prefill, prefill_after, decode, local;
  prefill_after.state->SetStreamKvLayers(false);  // the push-after-prefill path
  for (int32_t n : {3, 9, 23}) {
    const std::vector<int32_t> prompt = Prompt(n, n);
    grpc::Status local_status;
    const std::vector<int32_t> want = GenerateTokens(local, GenerateRequest(absl::StrCat("l", n), prompt, ""),
                                                     &local_status);
    ASSERT_TRUE(local_status.ok()) << local_status.error_message();
    EXPECT_EQ(want.size(), 6u);
    for (Worker* p : {&prefill, &prefill_after}) {
      grpc::Status remote_status;
      const std::vector<int32_t> remote = GenerateTokens(
          decode, GenerateRequest(absl::StrCat("r", n, p->state->stream_kv_layers()), prompt, p->server->address()),
          &remote_status);
      ASSERT_TRUE(remote_status.ok()) << remote_status.error_message();
      EXPECT_EQ(remote, want) << "prompt of " << n << " tokens, layers streamed: " << p->state->stream_kv_layers();
    }
  }
  EXPECT_EQ(prefill.UsedBlocksEventually(), 0);
  EXPECT_EQ(prefill_after.UsedBlocksEventually(), 0);
  EXPECT_EQ(decode.UsedBlocksEventually(), 0);
  EXPECT_THAT(prefill.Metrics(), testing::HasSubstr("kvmesh_kv_transfer_failures_total{direction=\"sent\"} 0"));
  EXPECT_THAT(decode.Metrics(), testing::HasSubstr("kvmesh_kv_transfer_failures_total{direction=\"received\"} 0"));
  EXPECT_THAT(prefill.Metrics(), testing::Not(testing::HasSubstr("kvmesh_kv_transfer_bytes_total{direction=\"sent\"} 0\n")));
}

}  // namespace
}  // namespace kvmesh::worker
