#include "cli/worker_flags.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli_common.h"
#include "cli/engine_flags.h"
#include "core/flag_checks.h"
#include "core/logging.h"
#include "core/stop_signals.h"
#include "rpc/tls_flags.h"
#include "worker/worker.h"

ABSL_DECLARE_FLAG(std::string, served_model_name);
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

namespace kvmesh::cli {
namespace {

absl::StatusOr<v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return v1::WORKER_ROLE_DECODE;
  if (role == "both") return v1::WORKER_ROLE_BOTH;
  return absl::InvalidArgumentError(absl::StrCat("--role must be prefill, decode or both, not '", role, "'"));
}

absl::StatusOr<worker::KvTransportChoice> ParseKvTransport(const std::string& transport) {
  if (transport == "auto") return worker::KvTransportChoice::kAuto;
  if (transport == "ucx") return worker::KvTransportChoice::kUcx;
  if (transport == "grpc") return worker::KvTransportChoice::kGrpc;
  return absl::InvalidArgumentError("--kv-transport must be ucx, grpc or auto");
}

absl::StatusOr<worker::WorkerOptions> WorkerOptionsFromFlags(const WorkerCommandLine& command) {
  worker::WorkerOptions o;
  absl::StatusOr<v1::WorkerRole> role = ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return role.status();
  if (command.role) {
    // NOTE: --role's default ("both") means "not given" for a role binary.
    if (*role != v1::WORKER_ROLE_BOTH && *role != *command.role) {
      return absl::InvalidArgumentError("--role differs from this binary's role");
    }
    role = *command.role;
  }
  o.role = *role;
  // NOTE: a tensor-parallel group takes either role: its ranks move their own KV heads
  // rank to rank (kv/transport/kv_rank_group.h). A CUDA worker with a role moves its KV
  // through a pinned host mirror of its device pool (WorkerModelFromFlags).
  absl::StatusOr<worker::KvTransportChoice> transport = ParseKvTransport(absl::GetFlag(FLAGS_kv_transport));
  if (!transport.ok()) return transport.status();
  o.kv_transport = *transport;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  o.scheduler = absl::GetFlag(FLAGS_scheduler);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (o.model_name.empty()) o.model_name = BaseName(ModelDirFlag());
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  o.stream_kv_layers = absl::GetFlag(FLAGS_kv_stream_layers);
  o.kv_lease_timeout_ms = absl::GetFlag(FLAGS_kv_lease_timeout_ms);
  o.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  o.kv_progress_timeout_ms = absl::GetFlag(FLAGS_kv_progress_timeout_ms);
  o.remote_prefill = {.fallback_to_local = absl::GetFlag(FLAGS_remote_prefill_fallback),
                      .timeout_base_ms = absl::GetFlag(FLAGS_remote_prefill_timeout_base_ms),
                      .timeout_us_per_token = absl::GetFlag(FLAGS_remote_prefill_timeout_us_per_token)};
  o.drain_timeout_ms = absl::GetFlag(FLAGS_drain_timeout_ms);
  return o;
}

absl::StatusOr<worker::WorkerModel> WorkerModelFromFlags(v1::WorkerRole role) {
  absl::StatusOr<LoadedModel> loaded = LoadModelOffThread(/*quiet=*/true);
  if (!loaded.ok()) return loaded.status();
  absl::StatusOr<EngineFromFlags> built =
      BuildEngineFromFlags(*loaded->model, {.moves_kv = role != v1::WORKER_ROLE_BOTH});
  if (!built.ok()) return built.status();
  const auto& config = loaded->model->config();
  worker::WorkerModel m;
  m.num_kv_heads = static_cast<int32_t>(config.num_key_value_heads);
  m.eos_token_ids.assign(config.eos_token_ids.begin(), config.eos_token_ids.end());
  if (auto id = loaded->tokenizer->eos_token_id();
      id && std::find(m.eos_token_ids.begin(), m.eos_token_ids.end(), *id) == m.eos_token_ids.end()) {
    m.eos_token_ids.push_back(*id);
  }
  m.engine = built->options;
  m.runner = std::move(built->runner);
  m.model = std::move(loaded->model);
  m.backend = std::move(loaded->backend);
  return m;
}

}  // namespace

absl::StatusOr<WorkerFromFlags> ParseWorkerCommandLine(int argc, char** argv, const WorkerCommandLine& command) {
  const std::string usage =
      command.role ? absl::StrCat(command.program, " [--listen HOST:PORT] [--scheduler HOST:PORT]: the ",
                                  command.role == v1::WORKER_ROLE_PREFILL ? "prefill" : "decode",
                                  " worker of the disaggregated cluster (kvmesh.v1.Worker over gRPC)")
                   : absl::StrCat(command.program,
                                  " --role prefill|decode|both [--listen HOST:PORT] [--scheduler HOST:PORT]: "
                                  "one worker of the disaggregated cluster (kvmesh.v1.Worker over gRPC)");
  ParseSubcommandFlags(argc, argv, usage, {"worker_flags", "serving_flags", kEngineFlagsFile, rpc::kTlsFlagsFile});
  // Before any server or channel: every gRPC hop of this worker uses it.
  if (absl::Status s = rpc::ConfigureTransportSecurityFromFlags(); !s.ok()) return s;
  WorkerFromFlags worker;
  absl::StatusOr<worker::WorkerOptions> options = WorkerOptionsFromFlags(command);
  if (!options.ok()) return options.status();
  worker.options = *std::move(options);
  absl::StatusOr<worker::WorkerModel> model = WorkerModelFromFlags(worker.options.role);
  if (!model.ok()) return model.status();
  worker.model = *std::move(model);
  return worker;
}

int ServeWorkerUntilStopped(const char* program, WorkerFromFlags from_flags) {
  absl::StatusOr<std::unique_ptr<worker::Worker>> worker =
      worker::Worker::Start(from_flags.options, std::move(from_flags.model));
  if (!worker.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(worker.status().message()).c_str());
    return 1;
  }
  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal);
  (*worker)->Drain();
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

int RunWorkerCommand(int argc, char** argv, const WorkerCommandLine& command) {
  BlockStopSignals();  // before any thread starts: they inherit the mask
  absl::StatusOr<WorkerFromFlags> worker = ParseWorkerCommandLine(argc, argv, command);
  if (!worker.ok()) {
    std::fprintf(stderr, "%s: %s\n", command.program, std::string(worker.status().message()).c_str());
    return 1;
  }
  return ServeWorkerUntilStopped(command.program, *std::move(worker));
}

}  // namespace kvmesh::cli
