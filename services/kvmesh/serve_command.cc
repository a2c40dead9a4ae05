// `kvmesh serve`: the whole system in one process (aggregated mode) — the
// OpenAI-compatible REST front door, the gRPC front door (kvmesh.v1.Inference, with
// health and reflection), the continuous-batching engine over the paged KV cache
// that both share, and /metrics — on the embedded default model unless --model
// says otherwise.
//
// SIGTERM/SIGINT drain gracefully: gRPC health turns NOT_SERVING, new requests get
// 503 / UNAVAILABLE, running ones finish on both front doors (until
// --drain-timeout-ms, then they are aborted), then the servers stop.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "cli/engine_flags.h"
#include "core/logging.h"
#include "core/stop_signals.h"
#include "engine/async_engine.h"
#include "engine/paged_model_runner.h"
#include "http/http_server.h"
#include "metrics/registry.h"
#include "rpc/grpc_server.h"
#include "serving/grpc_inference_service.h"
#include "serving/openai_routes.h"
#include "serving/openai_service.h"
#include "serving/serving_metrics.h"
#include "router/admission_flags.h"
#include "core/flag_checks.h"

ABSL_DECLARE_FLAG(std::string, served_model_name);  // serving_flags.cc
ABSL_DECLARE_FLAG(int64_t, drain_timeout_ms);

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for all interfaces).");
ABSL_FLAG(int, port, 8000, "Port to listen on; 0 picks a free one (printed at start).");
KVMESH_FLAG_RANGE(port, 0, 65535);
ABSL_FLAG(std::string, api_keys, "", "Comma-separated API keys; when set, requests need 'Authorization: Bearer KEY'.");
ABSL_FLAG(int, grpc_port, 50051,
          "gRPC port (kvmesh.v1.Inference + health + reflection) on --host; 0 picks a free one (printed at "
          "start), -1 disables gRPC.");
KVMESH_FLAG_RANGE(grpc_port, -1, 65535);
ABSL_FLAG(int, max_inflight_requests, 256,
          "Requests in flight before new ones get 429 (REST) / RESOURCE_EXHAUSTED (gRPC); each front door "
          "counts its own.");
KVMESH_FLAG_RANGE(max_inflight_requests, 1, 1000000);
ABSL_FLAG(int, http_threads, 2, "HTTP I/O threads.");
KVMESH_FLAG_RANGE(http_threads, 1, 1024);

namespace kvmesh::cli {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh serve: %s\n", message.c_str());
  return 1;
}

// --grpc-port (or --grpc_port, -grpc-port...) on the command line, or KVMESH_GRPC_PORT.
// (Debian's Abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine private.)
bool GrpcPortIsExplicit(int argc, char** argv) {
  if (std::getenv("KVMESH_GRPC_PORT") != nullptr) return true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    std::replace(arg.begin(), arg.end(), '-', '_');
    if (arg.starts_with("__grpc_port") || arg.starts_with("_grpc_port")) return true;
  }
  return false;
}

}  // namespace

int RunServe(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask

  ParseSubcommandFlags(argc, argv,
                       "kvmesh serve [--model DIR] [--host H --port P --grpc-port G]: the OpenAI-compatible "
                       "server (REST) and the kvmesh.v1.Inference gRPC API with the continuous-batching engine "
                       "in one process",
                       {"serve_command", "serving_flags", kEngineFlagsFile, router::kAdmissionFlagsFile});
  auto loaded = LoadModelOffThread(/*quiet=*/false);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  engine::LlamaModel& model = *loaded->model;
  const auto& config = model.config();

  auto built = BuildEngineFromFlags(model);
  if (!built.ok()) return Fail(std::string(built.status().message()));
  std::unique_ptr<engine::ModelRunner> runner = std::move(built->runner);
  engine::EngineOptions options = built->options;
  const int32_t max_model_len = options.max_model_len;
  auto engine = engine::Engine::Create(options, *runner);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  engine::AsyncEngine async_engine(std::move(engine).value());

  metrics::Registry registry;
  auto metrics = serving::ServingMetrics::Create(registry, [&async_engine] { return async_engine.stats(); });
  if (!metrics.ok()) return Fail(std::string(metrics.status().message()));

  std::optional<model::ChatTemplate> chat_template;
  if (auto t = model::ChatTemplate::ForModel(ModelDirFlag(), ChatTemplateFlag()); t.ok()) {
    chat_template = *t;
  } else if (!ChatTemplateFlag().empty() || t.status().code() != absl::StatusCode::kNotFound) {
    // An explicit --chat-template, or the model's own template, that fails to load is fatal.
    return Fail(std::string(t.status().message()));
  } else {
    KVMESH_LOG(kWarning) << "no chat template; /v1/chat/completions will refuse requests"
                         << LogKv("reason", t.status().message());
  }
  serving::OpenAiServiceOptions service_options;
  service_options.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (service_options.model_name.empty()) service_options.model_name = BaseName(ModelDirFlag());
  service_options.max_model_len = max_model_len;
  service_options.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight_requests);
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    service_options.api_keys.emplace_back(key);
  }
  service_options.eos_token_ids = config.eos_token_ids;
  if (auto id = loaded->tokenizer->eos_token_id();
      id && std::find(service_options.eos_token_ids.begin(), service_options.eos_token_ids.end(), *id) ==
                service_options.eos_token_ids.end()) {
    service_options.eos_token_ids.push_back(*id);
  }
  // One admission path for both front doors (limits, rate limits, fair share).
  auto admission = serving::AdmissionController::Create(
      router::AdmissionOptionsFromFlags(service_options.max_inflight_requests));
  if (!admission.ok()) return Fail(std::string(admission.status().message()));
  service_options.admission = admission->get();
  serving::OpenAiService service(service_options, *loaded->tokenizer, chat_template, async_engine, metrics->get());

  // The gRPC front door, on the same engine. Declared before the server that runs it
  // (destroyed after it: the server's calls reference the service).
  serving::GrpcInferenceService grpc_service({.model_name = service_options.model_name,
                                              .max_model_len = max_model_len,
                                              .max_inflight_requests = service_options.max_inflight_requests,
                                              .eos_token_ids = service_options.eos_token_ids,
                                              .api_keys = service_options.api_keys,
                                              .admission = admission->get()},
                                             *loaded->tokenizer, chat_template, async_engine, metrics->get());
  if (absl::GetFlag(FLAGS_grpc_port) > 65535 || absl::GetFlag(FLAGS_grpc_port) < -1) {
    return Fail("--grpc-port must be -1 (off), 0 (any free port) or a port number");
  }

  auto server = http::HttpServer::Create({.address = absl::GetFlag(FLAGS_host),
                                          .port = static_cast<uint16_t>(absl::GetFlag(FLAGS_port)),
                                          .num_threads = absl::GetFlag(FLAGS_http_threads)});
  if (!server.ok()) return Fail(std::string(server.status().message()));
  serving::RegisterOpenAiRoutes(**server, service, registry);
  if (auto s = (*server)->Start(); !s.ok()) return Fail(std::string(s.message()));
  KVMESH_LOG(kInfo) << "listening on http://" << absl::GetFlag(FLAGS_host) << ":" << (*server)->port()
                    << LogKv("model", service_options.model_name) << LogKv("kv_blocks", runner->num_blocks())
                    << LogKv("max_model_len", max_model_len) << LogKv("backend", loaded->backend->name());
  // Started last: nothing after it can fail, so no call can outlive an early return.
  std::unique_ptr<rpc::GrpcServer> grpc_server;
  if (const int grpc_port = absl::GetFlag(FLAGS_grpc_port); grpc_port >= 0) {
    const std::string host = absl::GetFlag(FLAGS_host);
    const std::string address =
        absl::StrCat(host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", grpc_port);
    auto started = rpc::GrpcServer::Start(
        {.address = address, .peers = rpc::PeerAuth::kClients}, {{&grpc_service, v1::Inference::service_full_name()}});
    if (started.ok()) {
      grpc_server = std::move(started).value();
      KVMESH_LOG(kInfo) << "grpc listening on " << grpc_server->address();
    } else {
      // NOTE: an explicitly chosen port (flag or KVMESH_GRPC_PORT) must be ours; the
      // default one is best effort, so that a second `kvmesh serve` on the machine
      // (another --port) still starts, with REST only.
      if (GrpcPortIsExplicit(argc, argv)) return Fail(std::string(started.status().message()));
      KVMESH_LOG(kWarning) << "gRPC disabled: the default port is taken; pass --grpc-port"
                           << LogKv("reason", started.status().message());
    }
  }

  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal)
                    << LogKv("timeout_ms", absl::GetFlag(FLAGS_drain_timeout_ms));
  if (grpc_server) grpc_server->SetServing(false);  // probes and load balancers look elsewhere
  service.StartDraining();
  async_engine.Drain(absl::GetFlag(FLAGS_drain_timeout_ms));
  // Every request has its final output now; give the last bytes time to reach clients.
  if (grpc_server) grpc_server->Shutdown(/*deadline_ms=*/5000);
  (*server)->Shutdown(std::chrono::milliseconds(5000));
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace kvmesh::cli
