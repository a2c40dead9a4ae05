// The worker process (docs/architecture.md §1): loads the model, runs the
// continuous-batching engine on its own thread (AsyncEngine) and serves kvmesh.v1.Worker
// (worker_service.h) on --listen as a prefill worker, a decode worker or both. With
// --scheduler it registers and heartbeats its load and KV events (heartbeater.h);
// --metrics-port serves /metrics; on SIGTERM it reports draining, finishes its
// requests, deregisters and stops.
#include "worker/worker_process.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "cli/engine_flags.h"
#include "http/http_server.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "rpc/grpc_server.h"
#include "rpc/kv_conversions.h"
#include "serving/serving_metrics.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "worker/heartbeater.h"
#include "worker/unreachable_reporter.h"
#include "worker/kv_transfer_metrics.h"
#include "worker/worker_health.h"
#include "worker/worker_service.h"
#include "worker/worker_state.h"
#include "core/flag_checks.h"
#include "rpc/tls_flags.h"

ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(int64_t, drain_timeout_ms);
ABSL_DECLARE_FLAG(int, tensor_parallel_size);  // engine_flags.cc

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "Worker gRPC address (host:port; port 0 picks a free one, logged).");
KVMESH_FLAG_ADDRESS(listen);
ABSL_FLAG(std::string, advertise_address, "",
          "Address other services reach this worker at (default: the bound --listen address).");
KVMESH_FLAG_ADDRESS(advertise_address);
ABSL_FLAG(std::string, role, "both", "prefill, decode or both.");
ABSL_FLAG(std::string, scheduler, "", "The scheduler's address (host:port); empty: run unregistered.");
KVMESH_FLAG_ADDRESS(scheduler);
ABSL_FLAG(std::string, worker_id, "", "Stable worker id (default: worker-<advertised address>).");
ABSL_FLAG(int32_t, metrics_port, -1,
          "HTTP port serving /metrics (Prometheus text), /health (503 until registered and while draining) and "
          "/live; 0 picks a free one (logged as "
          "'worker metrics on http://...'); -1: off.");
KVMESH_FLAG_RANGE(metrics_port, -1, 65535);
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "Address the /metrics port binds.");
ABSL_FLAG(bool, kv_stream_layers, true,
          "Prefill side: push each layer's KV to the decode worker as soon as it is computed, overlapping the "
          "transfer with the later layers; false: push it all after the prefill (for comparison).");
ABSL_FLAG(int64_t, kv_lease_timeout_ms, 30000,
          "Decode side: a remote prefill must deliver its KV within this; prefill side: pinned blocks are "
          "released after this.");
KVMESH_FLAG_RANGE(kv_lease_timeout_ms, 1, 86400000);

ABSL_FLAG(std::string, kv_transport, "auto",
          "How prefill -> decode KV moves: auto (the default: UCX when this worker can start it and the peer "
          "has it too, which the scheduler learns at registration; else gRPC), ucx (one-sided UCX puts into the "
          "decode worker's leased blocks; fails to start without UCX), or grpc (the PushKvBlocks byte stream).");
ABSL_FLAG(std::string, ucx_tls, "",
          "UCX transports for KV (UCX_TLS syntax: \"sm\", \"tcp\", \"shm,cma,tcp\"); empty: the UCX_TLS "
          "environment variable, else UCX's choice.");
ABSL_FLAG(int64_t, kv_progress_timeout_ms, 1000,
          "UCX KV peers not heard from for this long (dead or stopped) fail: the decode side fails the lease, "
          "the prefill side its push (and unpins the source blocks).");
KVMESH_FLAG_RANGE(kv_progress_timeout_ms, 1, 3600000);

ABSL_FLAG(bool, remote_prefill_fallback, true,
          "Decode side: when a remote prefill fails before its KV landed (the prefill worker died, hung or refused), "
          "prefill the request here instead of failing it.");
ABSL_FLAG(int64_t, remote_prefill_timeout_base_ms, 5000,
          "Decode side: a remote prefill's deadline is this plus --remote-prefill-timeout-us-per-token per prompt "
          "token (at most --kv-lease-timeout-ms); past it the request is prefilled here.");
KVMESH_FLAG_RANGE(remote_prefill_timeout_base_ms, 1, 86400000);
ABSL_FLAG(int64_t, remote_prefill_timeout_us_per_token, 5000,
          "Decode side: see --remote-prefill-timeout-base-ms. (A prefill worker that died or hangs is noticed "
          "sooner, in about 1.5 s, by the peer channel's keepalive or UCX's progress deadline: this deadline is for "
          "one that answers pings but makes no progress.)");
KVMESH_FLAG_RANGE(remote_prefill_timeout_us_per_token, 0, 60000000);

namespace kvmesh::worker {
namespace {

int Fail(const WorkerProcessOptions& process, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", process.program, message.c_str());
  return 1;
}



absl::StatusOr<v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return v1::WORKER_ROLE_DECODE;
  if (role == "both") return v1::WORKER_ROLE_BOTH;
  return absl::InvalidArgumentError(absl::StrCat("--role must be prefill, decode or both, not '", role, "'"));
}

}  // namespace

int RunWorkerProcess(int argc, char** argv, const WorkerProcessOptions& process) {
  cli::BlockStopSignals();  // before any thread starts: they inherit the mask

  const std::string usage =
      process.role ? absl::StrCat(process.program, " [--listen HOST:PORT] [--scheduler HOST:PORT]: the ",
                                  process.role == v1::WORKER_ROLE_PREFILL ? "prefill" : "decode",
                                  " worker of the disaggregated cluster (kvmesh.v1.Worker over gRPC)")
                   : absl::StrCat(process.program,
                                  " --role prefill|decode|both [--listen HOST:PORT] [--scheduler HOST:PORT]: "
                                  "one worker of the disaggregated cluster (kvmesh.v1.Worker over gRPC)");
  cli::ParseSubcommandFlags(argc, argv, usage,
                            {"worker_process", "serving_flags", cli::kEngineFlagsFile, rpc::kTlsFlagsFile});
  // Before any server or channel: every gRPC hop of this worker uses it.
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) {
    return Fail(process, std::string(s.message()));
  }
  absl::StatusOr<v1::WorkerRole> role = ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return Fail(process, std::string(role.status().message()));
  if (process.role) {
    // NOTE: --role's default ("both") means "not given" for a role binary.
    if (*role != v1::WORKER_ROLE_BOTH && *role != *process.role) {
      return Fail(process, "--role differs from this binary's role");
    }
    role = *process.role;
  }
  // KV moves between workers block by block out of one host pool; a tensor-parallel
  // group's KV is split over its ranks' pools, which no transfer path reads yet.
  if (absl::GetFlag(FLAGS_tensor_parallel_size) > 1 && *role != v1::WORKER_ROLE_BOTH) {
    return Fail(process,
                "--tensor-parallel-size > 1 needs --role both: prefill -> decode KV transfer of a "
                "tensor-parallel group's sharded KV is not supported");
  }
  // Likewise the CUDA runner's pool is in device memory, which the transfer path (host
  // blocks over gRPC) does not read yet.
  auto cuda_device = cli::CudaDeviceFromFlags();
  if (!cuda_device.ok()) return Fail(process, std::string(cuda_device.status().message()));
  if (*cuda_device >= 0 && *role != v1::WORKER_ROLE_BOTH) {
    return Fail(process,
                "--device cuda needs --role both: prefill -> decode KV transfer reads a host KV pool, and the CUDA "
                "runner's is in device memory");
  }
  auto loaded = cli::LoadModelOffThread(/*quiet=*/true);
  if (!loaded.ok()) return Fail(process, std::string(loaded.status().message()));
  engine::LlamaModel& model = *loaded->model;
  const auto& config = model.config();

  auto built = cli::BuildEngineFromFlags(model);
  if (!built.ok()) return Fail(process, std::string(built.status().message()));
  std::unique_ptr<engine::ModelRunner> runner = std::move(built->runner);
  engine::EngineOptions options = built->options;
  const int32_t max_model_len = options.max_model_len;
  // Drained by every heartbeat; without a scheduler nothing would drain them and the
  // engine's event queue would grow for as long as the worker runs.
  options.kv.record_events = !absl::GetFlag(FLAGS_scheduler).empty();
  options.lease_timeout_ms = absl::GetFlag(FLAGS_kv_lease_timeout_ms);
  options.prefill_release_timeout_ms = absl::GetFlag(FLAGS_kv_lease_timeout_ms);
  auto created = engine::Engine::Create(options, *runner);
  if (!created.ok()) return Fail(process, std::string(created.status().message()));
  auto block_spec = (*created)->kv_block_spec();
  if (!block_spec.ok()) return Fail(process, std::string(block_spec.status().message()));

  v1::KvCacheSpec spec;
  spec.set_block_size_tokens(block_spec->block_size_tokens);
  spec.set_num_layers(block_spec->num_layers);
  spec.set_num_kv_heads(static_cast<int32_t>(config.num_key_value_heads));
  spec.set_head_dim(block_spec->head_dim);
  auto dtype = rpc::KvDtypeToProto(block_spec->dtype);
  if (!dtype.ok()) return Fail(process, std::string(dtype.status().message()));
  spec.set_dtype(*dtype);
  spec.set_tp_size(1);
  spec.set_block_hash_salt(options.kv.salt);

  std::vector<int32_t> eos_token_ids(config.eos_token_ids.begin(), config.eos_token_ids.end());
  if (auto id = loaded->tokenizer->eos_token_id();
      id && std::find(eos_token_ids.begin(), eos_token_ids.end(), *id) == eos_token_ids.end()) {
    eos_token_ids.push_back(*id);
  }

  // The KV data plane: UCX over this worker's whole pool, registered once.
  const std::string kv_transport = absl::GetFlag(FLAGS_kv_transport);
  if (kv_transport != "ucx" && kv_transport != "grpc" && kv_transport != "auto") {
    return Fail(process, "--kv-transport must be ucx, grpc or auto");
  }
  std::unique_ptr<kv::UcxKvTransport> ucx;
  kv::KvPoolHandle ucx_pool;
  kv::KvStorage* storage = runner->kv_storage();
  if (kv_transport != "grpc" && *role != v1::WORKER_ROLE_BOTH) {
    absl::Status s = storage == nullptr ? absl::FailedPreconditionError("the model runner has no host KV pool")
                                        : absl::OkStatus();
    if (s.ok()) {
      auto created_ucx = kv::UcxKvTransport::Create(
          {.tls = absl::GetFlag(FLAGS_ucx_tls),
           .progress_timeout_ms = absl::GetFlag(FLAGS_kv_progress_timeout_ms),
           .receiver_timeout_ms = absl::GetFlag(FLAGS_kv_progress_timeout_ms)});
      s = created_ucx.status();
      if (created_ucx.ok()) {
        auto pool = (*created_ucx)->RegisterPool(storage->data(), storage->layout());
        s = pool.status();
        if (pool.ok()) {
          ucx = *std::move(created_ucx);
          ucx_pool = *pool;
        }
      }
    }
    if (!s.ok()) {
      if (kv_transport == "ucx") return Fail(process, absl::StrCat("--kv-transport ucx: ", s.message()));
      KVMESH_LOG(kWarning) << "UCX unavailable, KV moves over gRPC" << LogKv("status", s.ToString());
    }
  }

  engine::AsyncEngine async_engine(*std::move(created));
  WorkerState state(async_engine, absl::GetFlag(FLAGS_worker_id), spec, *block_spec, eos_token_ids,
                    absl::GetFlag(FLAGS_kv_lease_timeout_ms));
  // /metrics: the engine's gauges and token counters (serving::ServingMetrics) and the
  // KV transfer counters. Registered before serving, so no call sees them half made.
  metrics::Registry registry;
  auto serving_metrics = serving::ServingMetrics::Create(registry, [&async_engine] { return async_engine.stats(); });
  if (!serving_metrics.ok()) return Fail(process, std::string(serving_metrics.status().message()));
  auto transfer_metrics = KvTransferMetrics::Create(registry);
  if (!transfer_metrics.ok()) return Fail(process, std::string(transfer_metrics.status().message()));
  state.SetMetrics(serving_metrics->get(), transfer_metrics->get());
  state.SetStreamKvLayers(absl::GetFlag(FLAGS_kv_stream_layers));
  if (ucx) state.SetKvTransport(ucx.get(), ucx_pool, storage->data(), storage->layout());
  state.SetRemotePrefillPolicy({.fallback_to_local = absl::GetFlag(FLAGS_remote_prefill_fallback),
                                .timeout_base_ms = absl::GetFlag(FLAGS_remote_prefill_timeout_base_ms),
                                .timeout_us_per_token = absl::GetFlag(FLAGS_remote_prefill_timeout_us_per_token)});
  // Failed remote prefills are recorded by the engine (FallBackToLocalPrefill).
  if (absl::Status s = registry
                           .AddCallbackGauge("kvmesh_kv_remote_prefill_fallbacks",
                                             "Remote prefills that failed before their KV landed and were prefilled "
                                             "on this decode worker instead, since start.",
                                             [&async_engine] {
                                               return static_cast<double>(
                                                   async_engine.stats().num_remote_prefill_fallbacks);
                                             })
                           .status();
      !s.ok()) {
    return Fail(process, std::string(s.message()));
  }
  // The probes' view (worker_health.h); with --scheduler, ready once registered.
  WorkerHealth health(/*needs_registration=*/!absl::GetFlag(FLAGS_scheduler).empty());
  std::unique_ptr<http::HttpServer> metrics_server;
  if (const int32_t port = absl::GetFlag(FLAGS_metrics_port); port >= 0) {
    auto created_server = http::HttpServer::Create(
        {.address = absl::GetFlag(FLAGS_metrics_host), .port = static_cast<uint16_t>(port), .num_threads = 1});
    if (!created_server.ok()) return Fail(process, std::string(created_server.status().message()));
    metrics_server = *std::move(created_server);
    metrics_server->Handle("GET", "/metrics", [&registry](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
      (void)w->Send(http::HttpResponse::Text(200, registry.Exposition(), std::string(metrics::kExpositionContentType)));
    });
    metrics_server->Handle("GET", "/health", [&health](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
      const ProbeAnswer answer = health.Health();
      (void)w->Send(http::HttpResponse::Json(answer.status_code, answer.body));
    });
    metrics_server->Handle("GET", "/live", [&health](http::HttpRequest, std::shared_ptr<http::ResponseWriter> w) {
      const ProbeAnswer answer = health.Live();
      (void)w->Send(http::HttpResponse::Json(answer.status_code, answer.body));
    });
    if (const absl::Status s = metrics_server->Start(); !s.ok()) return Fail(process, std::string(s.message()));
    KVMESH_LOG(kInfo) << "worker metrics on http://" << absl::GetFlag(FLAGS_metrics_host) << ":"
                      << metrics_server->port() << "/metrics";
  }
  // Before serving: a Generate may need it at once.
  std::unique_ptr<UnreachableReporter> reporter;
  if (const std::string scheduler = absl::GetFlag(FLAGS_scheduler); !scheduler.empty()) {
    reporter = std::make_unique<UnreachableReporter>(
        UnreachableReporterOptions{.scheduler_address = scheduler, .reporter = absl::GetFlag(FLAGS_worker_id)});
    state.SetUnreachableReporter(
        [r = reporter.get()](const std::string& address, const std::string& reason) { r->Report(address, reason); });
  }
  WorkerService service(state);
  // Peers ping every 500 ms (WorkerState::PeerChannelOptions): that is how a stopped
  // worker is noticed mid-call.
  auto server = rpc::GrpcServer::Start({.address = absl::GetFlag(FLAGS_listen), .min_client_ping_interval_ms = 400},
                                       {{&service, v1::Worker::service_full_name()}});
  if (!server.ok()) return Fail(process, std::string(server.status().message()));
  std::string address = absl::GetFlag(FLAGS_advertise_address);
  if (address.empty()) address = (*server)->address();
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = absl::StrCat("worker-", address);
  state.SetIdentity(worker_id, address);
  KVMESH_LOG(kInfo) << "worker listening on " << address << LogKv("role", absl::GetFlag(FLAGS_role))
                    << LogKv("worker_id", worker_id) << LogKv("kv_blocks", runner->num_blocks())
                    << LogKv("kv_transport", ucx ? "ucx" : "grpc");

  std::unique_ptr<Heartbeater> heartbeater;
  if (const std::string scheduler = absl::GetFlag(FLAGS_scheduler); !scheduler.empty()) {
    v1::RegisterRequest registration;
    registration.set_worker_id(worker_id);
    registration.set_address(address);
    registration.set_role(*role);
    std::string model_name = absl::GetFlag(FLAGS_served_model_name);
    if (model_name.empty()) model_name = cli::BaseName(cli::ModelDirFlag());
    registration.set_model(model_name);
    *registration.mutable_kv_cache_spec() = spec;
    registration.mutable_capacity()->set_max_num_seqs(options.scheduler.max_num_seqs);
    registration.mutable_capacity()->set_max_num_batched_tokens(options.scheduler.max_num_batched_tokens);
    registration.mutable_capacity()->set_max_model_len(max_model_len);
    // What placement pairs workers by: UCX when both sides of a hand-off have it.
    registration.add_kv_transports(v1::KV_TRANSPORT_GRPC_STREAM);
    if (ucx) registration.add_kv_transports(v1::KV_TRANSPORT_UCX);
    heartbeater = std::make_unique<Heartbeater>(state, scheduler, std::move(registration), &health);
  }

  const int signal = cli::WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal);
  health.SetDraining();
  if (heartbeater) heartbeater->SetDraining();
  (*server)->SetServing(false);
  // Requests still queued, that streamed nothing, go back to the router (ABORTED, which
  // it places again elsewhere) rather than wait behind the running ones.
  async_engine.Post([](engine::Engine& e) {
    absl::StatusOr<std::vector<engine::RequestOutput>> handed =
        e.HandBackUnstarted(absl::AbortedError("the worker is draining: the request was handed back unstarted"));
    if (handed.ok() && !handed->empty()) {
      KVMESH_LOG(kInfo) << "handed queued requests back" << LogKv("count", handed->size());
    }
  });
  async_engine.Drain(absl::GetFlag(FLAGS_drain_timeout_ms));
  if (heartbeater) heartbeater->Stop();
  (*server)->Shutdown(/*deadline_ms=*/5000);
  if (metrics_server) metrics_server->Shutdown(std::chrono::milliseconds(1000));
  // The remote prefills and KV pushes still completing use the state, the transport and
  // the engine: they end before any of those does.
  state.outgoing_calls().CancelAllAndWait();
  // Before the state and the engine its callbacks post to: open leases and pushes end.
  ucx.reset();
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace kvmesh::worker
