#include "worker/worker.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "metrics/text_format.h"
#include "rpc/kv_conversions.h"

namespace kvmesh::worker {
namespace {

const char* RoleName(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case v1::WORKER_ROLE_DECODE:
      return "decode";
    default:
      return "both";
  }
}

void AnswerProbe(const ProbeAnswer& answer, const std::shared_ptr<http::ResponseWriter>& w) {
  (void)w->Send(http::HttpResponse::Json(answer.status_code, answer.body));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options, WorkerModel model) {
  if (model.runner == nullptr) return absl::InvalidArgumentError("a worker needs a model runner");
  std::unique_ptr<Worker> worker(new Worker(options, std::move(model)));
  KVMESH_RETURN_IF_ERROR(worker->Init());
  return worker;
}

absl::Status Worker::Init() {
  engine::EngineOptions engine_options = model_.engine;
  // Drained by every heartbeat; without a scheduler nothing would drain them and the
  // engine's event queue would grow for as long as the worker runs.
  engine_options.kv.record_events = !options_.scheduler.empty();
  engine_options.lease_timeout_ms = options_.kv_lease_timeout_ms;
  engine_options.prefill_release_timeout_ms = options_.kv_lease_timeout_ms;
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> created,
                          engine::Engine::Create(engine_options, *model_.runner));
  KVMESH_ASSIGN_OR_RETURN(const kv::KvBlockSpec block_spec, created->kv_block_spec());

  v1::KvCacheSpec spec;
  spec.set_block_size_tokens(block_spec.block_size_tokens);
  spec.set_num_layers(block_spec.num_layers);
  spec.set_num_kv_heads(model_.num_kv_heads);
  spec.set_head_dim(block_spec.head_dim);
  KVMESH_ASSIGN_OR_RETURN(const v1::KvDtype dtype, rpc::KvDtypeToProto(block_spec.dtype));
  spec.set_dtype(dtype);
  spec.set_tp_size(created->kv_tp_size());
  spec.set_block_hash_salt(engine_options.kv.salt);
  kv_store_key_spaces_ = created->shared_kv_key_spaces();

  if (options_.kv_transport != KvTransportChoice::kGrpc && options_.role != v1::WORKER_ROLE_BOTH) {
    KVMESH_RETURN_IF_ERROR(StartUcx(model_.runner->kv_rank_storages()));
  }

  engine_ = std::make_unique<engine::AsyncEngine>(std::move(created));
  state_ = std::make_unique<WorkerState>(*engine_, options_.worker_id, spec, block_spec, model_.eos_token_ids,
                                         options_.kv_lease_timeout_ms);
  // /metrics: the engine's gauges and token counters (serving::ServingMetrics) and the
  // KV transfer counters. Registered before serving, so no call sees them half made.
  engine::AsyncEngine* engine = engine_.get();
  KVMESH_ASSIGN_OR_RETURN(serving_metrics_,
                          serving::ServingMetrics::Create(registry_, [engine] { return engine->stats(); }));
  KVMESH_ASSIGN_OR_RETURN(transfer_metrics_, KvTransferMetrics::Create(registry_));
  state_->SetMetrics(serving_metrics_.get(), transfer_metrics_.get());
  state_->SetStreamKvLayers(options_.stream_kv_layers);
  if (!ucx_.empty()) state_->SetKvTransports(ucx_ranks_);
  state_->SetRemotePrefillPolicy(options_.remote_prefill);
  // Failed remote prefills are recorded by the engine (FallBackToLocalPrefill).
  KVMESH_RETURN_IF_ERROR(registry_
                             .AddCallbackGauge("kvmesh_kv_remote_prefill_fallbacks",
                                               "Remote prefills that failed before their KV landed and were "
                                               "prefilled on this decode worker instead, since start.",
                                               [engine] {
                                                 return static_cast<double>(
                                                     engine->stats().num_remote_prefill_fallbacks);
                                               })
                             .status());
  // The probes' view (worker_health.h); with a scheduler, ready once registered.
  health_ = std::make_unique<WorkerHealth>(/*needs_registration=*/!options_.scheduler.empty());
  KVMESH_RETURN_IF_ERROR(StartMetricsServer());
  // Before serving: a Generate may need it at once.
  if (!options_.scheduler.empty()) {
    reporter_ = std::make_unique<UnreachableReporter>(
        UnreachableReporterOptions{.scheduler_address = options_.scheduler, .reporter = options_.worker_id});
    state_->SetUnreachableReporter(
        [r = reporter_.get()](const std::string& address, const std::string& reason) { r->Report(address, reason); });
  }
  service_ = std::make_unique<WorkerService>(*state_);
  // Peers ping every 500 ms (WorkerState::PeerChannelOptions): that is how a stopped
  // worker is noticed mid-call.
  KVMESH_ASSIGN_OR_RETURN(server_,
                          rpc::GrpcServer::Start({.address = options_.listen, .min_client_ping_interval_ms = 400},
                                                 {{service_.get(), v1::Worker::service_full_name()}}));
  address_ = options_.advertise_address.empty() ? server_->address() : options_.advertise_address;
  worker_id_ = options_.worker_id.empty() ? absl::StrCat("worker-", address_) : options_.worker_id;
  state_->SetIdentity(worker_id_, address_);
  KVMESH_LOG(kInfo) << "worker listening on " << address_ << LogKv("role", RoleName(options_.role))
                    << LogKv("worker_id", worker_id_) << LogKv("kv_blocks", model_.runner->num_blocks())
                    << LogKv("kv_transport", ucx_.empty() ? "grpc" : "ucx") << LogKv("tp_size", spec.tp_size());
  if (!options_.scheduler.empty()) StartHeartbeats(spec);
  return absl::OkStatus();
}

// The KV data plane: UCX over each rank's whole pool, registered once. A
// tensor-parallel rank gets its own transport (UCX worker and progress thread), so the
// ranks' puts run side by side, as they would from one process per GPU.
absl::Status Worker::StartUcx(const std::vector<kv::KvStorage*>& rank_storages) {
  absl::Status s = rank_storages.empty() ? absl::FailedPreconditionError("the model runner has no host KV pool")
                                         : absl::OkStatus();
  for (size_t r = 0; r < rank_storages.size() && s.ok(); ++r) {
    kv::KvStorage* storage = rank_storages[r];
    // Runs carry their checksums, checked as they land (kv_transport_bench
    // --checksum-runs 0|1 for what that costs).
    auto created = kv::UcxKvTransport::Create({.tls = options_.ucx_tls,
                                               .progress_timeout_ms = options_.kv_progress_timeout_ms,
                                               .receiver_timeout_ms = options_.kv_progress_timeout_ms,
                                               .checksum_runs = true});
    s = created.status();
    if (!created.ok()) break;
    auto pool = (*created)->RegisterPool(storage->data(), storage->layout());
    s = pool.status();
    if (!pool.ok()) break;
    ucx_ranks_.push_back({.pool = {.transport = created->get(), .pool = *pool},
                          .base = storage->data(),
                          .layout = storage->layout()});
    ucx_.push_back(*std::move(created));
  }
  if (s.ok()) return s;
  ucx_ranks_.clear();
  ucx_.clear();
  if (options_.kv_transport == KvTransportChoice::kUcx) {
    return absl::FailedPreconditionError(absl::StrCat("--kv-transport ucx: ", s.message()));
  }
  KVMESH_LOG(kWarning) << "UCX unavailable, KV moves over gRPC" << LogKv("status", s.ToString());
  return absl::OkStatus();
}

absl::Status Worker::StartMetricsServer() {
  if (options_.metrics_port < 0) return absl::OkStatus();
  KVMESH_ASSIGN_OR_RETURN(metrics_server_,
                          http::HttpServer::Create({.address = options_.metrics_host,
                                                    .port = static_cast<uint16_t>(options_.metrics_port),
                                                    .num_threads = 1}));
  metrics::Registry* registry = &registry_;
  WorkerHealth* health = health_.get();
  metrics_server_->Handle("GET", "/metrics", [registry](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
    (void)w->Send(
        http::HttpResponse::Text(200, registry->Exposition(), std::string(metrics::kExpositionContentType)));
  });
  metrics_server_->Handle("GET", "/health", [health](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
    AnswerProbe(health->Health(), w);
  });
  metrics_server_->Handle("GET", "/live", [health](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
    AnswerProbe(health->Live(), w);
  });
  KVMESH_RETURN_IF_ERROR(metrics_server_->Start());
  KVMESH_LOG(kInfo) << "worker metrics on http://" << options_.metrics_host << ":" << metrics_server_->port()
                    << "/metrics";
  return absl::OkStatus();
}

void Worker::StartHeartbeats(const v1::KvCacheSpec& spec) {
  v1::RegisterRequest registration;
  registration.set_worker_id(worker_id_);
  registration.set_address(address_);
  registration.set_role(options_.role);
  registration.set_model(options_.model_name);
  *registration.mutable_kv_cache_spec() = spec;
  registration.mutable_capacity()->set_max_num_seqs(model_.engine.scheduler.max_num_seqs);
  registration.mutable_capacity()->set_max_num_batched_tokens(model_.engine.scheduler.max_num_batched_tokens);
  registration.mutable_capacity()->set_max_model_len(model_.engine.max_model_len);
  // What placement pairs workers by: UCX when both sides of a hand-off have it.
  registration.add_kv_transports(v1::KV_TRANSPORT_GRPC_STREAM);
  if (!ucx_.empty()) registration.add_kv_transports(v1::KV_TRANSPORT_UCX);
  for (const kv::SharedKeySpace& space : kv_store_key_spaces_) {
    v1::KvKeySpace* out = registration.add_kv_store_key_spaces();
    out->set_low(space.low);
    out->set_high(space.high);
  }
  heartbeater_ = std::make_unique<Heartbeater>(*state_, options_.scheduler, std::move(registration), health_.get());
}

void Worker::Drain() {
  if (drained_) return;
  drained_ = true;
  if (server_ == nullptr) return;  // Start failed before serving: the members tear down alone
  health_->SetDraining();
  if (heartbeater_) heartbeater_->SetDraining();
  server_->SetServing(false);
  // Requests still queued, that streamed nothing, go back to the router (ABORTED, which
  // it places again elsewhere) rather than wait behind the running ones.
  engine_->Post([](engine::Engine& e) {
    absl::StatusOr<std::vector<engine::RequestOutput>> handed =
        e.HandBackUnstarted(absl::AbortedError("the worker is draining: the request was handed back unstarted"));
    if (handed.ok() && !handed->empty()) {
      KVMESH_LOG(kInfo) << "handed queued requests back" << LogKv("count", handed->size());
    }
  });
  engine_->Drain(options_.drain_timeout_ms);
  if (heartbeater_) heartbeater_->Stop();
  server_->Shutdown(/*deadline_ms=*/5000);
  if (metrics_server_) metrics_server_->Shutdown(std::chrono::milliseconds(1000));
  // The remote prefills and KV pushes still completing use the state, the transport and
  // the engine: they end before any of those does.
  state_->outgoing_calls().CancelAllAndWait();
  // Before the state and the engine its callbacks post to: open leases and pushes end.
  ucx_ranks_.clear();
  ucx_.clear();
}

Worker::~Worker() {
  Drain();
  // A Start that failed half way: whatever of the data plane started goes before the
  // state and the engine.
  if (state_) state_->outgoing_calls().CancelAllAndWait();
  ucx_ranks_.clear();
  ucx_.clear();
}

}  // namespace kvmesh::worker
