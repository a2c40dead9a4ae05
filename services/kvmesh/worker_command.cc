// `kvmesh worker`: one worker of the disaggregated cluster (ARCHITECTURE.md §1). It
// loads the model, runs the continuous-batching engine on its own thread (AsyncEngine)
// and serves kvmesh.v1.Worker (worker_service.h) on --listen as a prefill worker, a
// decode worker or both (--role). With --scheduler it registers, heartbeats its load
// and KV events (the engine records them; each heartbeat drains them), and on SIGTERM
// reports draining, finishes its requests, deregisters and stops.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli_common.h"
#include "commands.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "engine/paged_model_runner.h"
#include "engine_flags.h"
#include "http/http_server.h"
#include "kv_transfer_metrics.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "rpc/channel.h"
#include "rpc/grpc_server.h"
#include "rpc/kv_conversions.h"
#include "rpc/sampling_conversions.h"
#include "rpc/status_conversion.h"
#include "serving/serving_metrics.h"
#include "worker_service.h"
#include "worker_state.h"

ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(int64_t, drain_timeout_ms);

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "Worker gRPC address (host:port; port 0 picks a free one, logged).");
ABSL_FLAG(std::string, advertise_address, "",
          "Address other services reach this worker at (default: the bound --listen address).");
ABSL_FLAG(std::string, role, "both", "prefill, decode or both.");
ABSL_FLAG(std::string, scheduler, "", "The scheduler's address (host:port); empty: run unregistered.");
ABSL_FLAG(std::string, worker_id, "", "Stable worker id (default: worker-<advertised address>).");
ABSL_FLAG(int32_t, metrics_port, -1,
          "HTTP port serving /metrics (Prometheus text) and /health; 0 picks a free one (logged as "
          "'worker metrics on http://...'); -1: off.");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "Address the /metrics port binds.");
ABSL_FLAG(int64_t, kv_lease_timeout_ms, 30000,
          "Decode side: a remote prefill must deliver its KV within this; prefill side: pinned blocks are "
          "released after this.");

namespace kvmesh::cli {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh worker: %s\n", message.c_str());
  return 1;
}


// ---------------------------------------------------------------------------------------
// Registration and heartbeats (its own thread).
class Heartbeater {
 public:
  Heartbeater(WorkerState& state, std::string scheduler, v1::RegisterRequest registration)
      : state_(state),
        stub_(v1::Scheduler::NewStub(rpc::CreateChannel(scheduler))),
        registration_(std::move(registration)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Heartbeater() { Stop(); }

  void SetDraining() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    cv_.notify_all();
  }
  // Stops heartbeating and deregisters.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 2000);
    v1::DeregisterRequest request;
    request.set_worker_id(registration_.worker_id());
    v1::DeregisterResponse response;
    const grpc::Status s = stub_->Deregister(&context, request, &response);
    KVMESH_LOG(kInfo) << "deregistered" << LogKv("ok", s.ok());
  }

 private:
  bool Register() {
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 2000);
    v1::RegisterResponse response;
    const grpc::Status s = stub_->Register(&context, registration_, &response);
    if (!s.ok()) {
      KVMESH_LOG(kWarning) << "register failed; retrying" << LogKv("status", s.error_message());
      return false;
    }
    if (response.heartbeat_interval_ms() > 0) interval_ms_ = response.heartbeat_interval_ms();
    KVMESH_LOG(kInfo) << "registered with the scheduler" << LogKv("worker_id", registration_.worker_id())
                      << LogKv("heartbeat_ms", interval_ms_);
    snapshot_ = true;
    return true;
  }

  void Loop() {
    bool registered = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      if (!registered) registered = Register();
      if (registered) registered = Beat();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(registered ? interval_ms_ : 1000), [this] { return stopping_; });
    }
  }

  // False when the scheduler forgot us (Register again).
  bool Beat() {
    auto promise = std::make_shared<std::promise<std::pair<engine::EngineStats, std::vector<kv::KvEvent>>>>();
    auto future = promise->get_future();
    state_.engine().Post([promise](engine::Engine& e) { promise->set_value({e.stats(), e.DrainKvEvents()}); });
    if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) return true;
    auto [stats, events] = future.get();
    for (const kv::KvEvent& event : events) {
      if (event.kind == kv::KvEvent::Kind::kStored) {
        stored_[{event.block_hash, event.tier}] = event;
      } else {
        stored_.erase({event.block_hash, event.tier});
      }
    }
    v1::HeartbeatRequest request;
    request.set_worker_id(registration_.worker_id());
    v1::WorkerLoad* load = request.mutable_load();
    load->set_num_running_seqs(stats.num_running_seqs + stats.num_receiving_seqs + stats.num_prefilled_seqs);
    load->set_num_waiting_seqs(stats.num_waiting_seqs);
    load->set_kv_blocks_total(stats.num_kv_blocks);
    load->set_kv_blocks_used(stats.num_kv_blocks_used);
    load->set_kv_blocks_free(stats.num_kv_blocks_free);
    load->set_kv_blocks_cached(stats.num_kv_blocks_cached);
    if (snapshot_) {
      request.set_kv_events_snapshot(true);
      for (const auto& [key, event] : stored_) rpc::ToProto(event, request.add_kv_events());
    } else {
      for (const kv::KvEvent& event : events) rpc::ToProto(event, request.add_kv_events());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_draining(draining_);
    }
    grpc::ClientContext context;
    rpc::SetTimeout(&context, 2000);
    v1::HeartbeatResponse response;
    const grpc::Status s = stub_->Heartbeat(&context, request, &response);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return false;
    if (!s.ok()) {
      // Events of a failed heartbeat are lost to the scheduler: resend everything next time.
      snapshot_ = true;
      KVMESH_LOG(kWarning) << "heartbeat failed" << LogKv("status", s.error_message());
      return true;
    }
    snapshot_ = false;
    return true;
  }

  WorkerState& state_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  const v1::RegisterRequest registration_;
  uint32_t interval_ms_ = 1000;
  bool snapshot_ = true;  // heartbeat thread only
  absl::flat_hash_map<std::pair<kv::BlockHash, kv::Tier>, kv::KvEvent> stored_;  // heartbeat thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool draining_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

absl::StatusOr<v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return v1::WORKER_ROLE_DECODE;
  if (role == "both") return v1::WORKER_ROLE_BOTH;
  return absl::InvalidArgumentError(absl::StrCat("--role must be prefill, decode or both, not '", role, "'"));
}

}  // namespace

int RunWorker(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask

  ParseSubcommandFlags(argc, argv,
                       "kvmesh worker --role prefill|decode|both [--listen HOST:PORT] [--scheduler HOST:PORT]: "
                       "one worker of the disaggregated cluster (kvmesh.v1.Worker over gRPC)",
                       {"worker_command", kEngineFlagsFile});
  auto role = ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return Fail(std::string(role.status().message()));
  auto loaded = LoadModelOffThread(/*quiet=*/true);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  engine::LlamaModel& model = *loaded->model;
  const auto& config = model.config();

  auto built = BuildEngineFromFlags(model);
  if (!built.ok()) return Fail(std::string(built.status().message()));
  std::unique_ptr<engine::ModelRunner> runner = std::move(built->runner);
  engine::EngineOptions options = built->options;
  const int32_t max_model_len = options.max_model_len;
  options.kv.record_events = true;  // drained by every heartbeat
  options.lease_timeout_ms = absl::GetFlag(FLAGS_kv_lease_timeout_ms);
  options.prefill_release_timeout_ms = absl::GetFlag(FLAGS_kv_lease_timeout_ms);
  auto created = engine::Engine::Create(options, *runner);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  auto block_spec = (*created)->kv_block_spec();
  if (!block_spec.ok()) return Fail(std::string(block_spec.status().message()));

  v1::KvCacheSpec spec;
  spec.set_block_size_tokens(block_spec->block_size_tokens);
  spec.set_num_layers(block_spec->num_layers);
  spec.set_num_kv_heads(static_cast<int32_t>(config.num_key_value_heads));
  spec.set_head_dim(block_spec->head_dim);
  auto dtype = rpc::KvDtypeToProto(block_spec->dtype);
  if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
  spec.set_dtype(*dtype);
  spec.set_tp_size(1);
  spec.set_block_hash_salt(options.kv.salt);

  std::vector<int32_t> eos_token_ids(config.eos_token_ids.begin(), config.eos_token_ids.end());
  if (auto id = loaded->tokenizer->eos_token_id();
      id && std::find(eos_token_ids.begin(), eos_token_ids.end(), *id) == eos_token_ids.end()) {
    eos_token_ids.push_back(*id);
  }

  engine::AsyncEngine async_engine(*std::move(created));
  WorkerState state(async_engine, absl::GetFlag(FLAGS_worker_id), spec, *block_spec, eos_token_ids,
                    absl::GetFlag(FLAGS_kv_lease_timeout_ms));
  // /metrics: the engine's gauges and token counters (serving::ServingMetrics) and the
  // KV transfer counters. Registered before serving, so no call sees them half made.
  metrics::Registry registry;
  auto serving_metrics = serving::ServingMetrics::Create(registry, [&async_engine] { return async_engine.stats(); });
  if (!serving_metrics.ok()) return Fail(std::string(serving_metrics.status().message()));
  auto transfer_metrics = KvTransferMetrics::Create(registry);
  if (!transfer_metrics.ok()) return Fail(std::string(transfer_metrics.status().message()));
  state.SetMetrics(serving_metrics->get(), transfer_metrics->get());
  std::unique_ptr<http::HttpServer> metrics_server;
  if (const int32_t port = absl::GetFlag(FLAGS_metrics_port); port >= 0) {
    if (port > 65535) return Fail("--metrics_port must be in [0, 65535] (or -1: off)");
    auto created_server = http::HttpServer::Create(
        {.address = absl::GetFlag(FLAGS_metrics_host), .port = static_cast<uint16_t>(port), .num_threads = 1});
    if (!created_server.ok()) return Fail(std::string(created_server.status().message()));
    metrics_server = *std::move(created_server);
    metrics_server->Handle("GET", "/metrics", [&registry](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
      (void)w->Send(http::HttpResponse::Text(200, registry.Exposition(), std::string(metrics::kExpositionContentType)));
    });
    metrics_server->Handle("GET", "/health", [](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
      (void)w->Send(http::HttpResponse::Json(200, R"({"status":"ok"})"));
    });
    if (const absl::Status s = metrics_server->Start(); !s.ok()) return Fail(std::string(s.message()));
    KVMESH_LOG(kInfo) << "worker metrics on http://" << absl::GetFlag(FLAGS_metrics_host) << ":"
                      << metrics_server->port() << "/metrics";
  }
  WorkerService service(state);
  auto server = rpc::GrpcServer::Start({.address = absl::GetFlag(FLAGS_listen)},
                                       {{&service, v1::Worker::service_full_name()}});
  if (!server.ok()) return Fail(std::string(server.status().message()));
  std::string address = absl::GetFlag(FLAGS_advertise_address);
  if (address.empty()) address = (*server)->address();
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = absl::StrCat("worker-", address);
  state.SetIdentity(worker_id, address);
  KVMESH_LOG(kInfo) << "worker listening on " << address << LogKv("role", absl::GetFlag(FLAGS_role))
                    << LogKv("worker_id", worker_id) << LogKv("kv_blocks", runner->num_blocks());

  std::unique_ptr<Heartbeater> heartbeater;
  if (const std::string scheduler = absl::GetFlag(FLAGS_scheduler); !scheduler.empty()) {
    v1::RegisterRequest registration;
    registration.set_worker_id(worker_id);
    registration.set_address(address);
    registration.set_role(*role);
    std::string model_name = absl::GetFlag(FLAGS_served_model_name);
    if (model_name.empty()) model_name = BaseName(ModelDirFlag());
    registration.set_model(model_name);
    *registration.mutable_kv_cache_spec() = spec;
    registration.mutable_capacity()->set_max_num_seqs(options.scheduler.max_num_seqs);
    registration.mutable_capacity()->set_max_num_batched_tokens(options.scheduler.max_num_batched_tokens);
    registration.mutable_capacity()->set_max_model_len(max_model_len);
    heartbeater = std::make_unique<Heartbeater>(state, scheduler, std::move(registration));
  }

  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal);
  if (heartbeater) heartbeater->SetDraining();
  (*server)->SetServing(false);
  async_engine.Drain(absl::GetFlag(FLAGS_drain_timeout_ms));
  if (heartbeater) heartbeater->Stop();
  (*server)->Shutdown(/*deadline_ms=*/5000);
  if (metrics_server) metrics_server->Shutdown(std::chrono::milliseconds(1000));
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace kvmesh::cli
