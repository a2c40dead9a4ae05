// `kvmesh router`: the cluster's REST front door (ARCHITECTURE.md §1). The same
// OpenAI-compatible API as `kvmesh serve` (serving::OpenAiService: tokenization, chat
// template, incremental detokenization, stop strings, SSE), but its tokens come from
// the workers: each request is placed by the scheduler (--scheduler) and streamed from
// the chosen decode worker (RemoteTokenSource). Loads only the model's config and
// tokenizer, not its weights.
//
// SIGTERM/SIGINT: running requests may finish for --drain-timeout-ms, then the server
// stops (cancelling the rest). NOTE: new requests are still accepted meanwhile.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "cli_common.h"
#include "commands.h"
#include "core/logging.h"
#include "http/http_server.h"
#include "metrics/registry.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "remote_token_source.h"
#include "serving/openai_routes.h"
#include "serving/openai_service.h"
#include "serving/serving_metrics.h"

// Shared with `kvmesh serve` (serve_command.cc) and `kvmesh worker` (worker_command.cc).
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(std::string, api_keys);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(int, max_inflight_requests);
ABSL_DECLARE_FLAG(int, http_threads);
ABSL_DECLARE_FLAG(int64_t, drain_timeout_ms);
ABSL_DECLARE_FLAG(std::string, scheduler);

ABSL_FLAG(int, router_max_num_seqs, 256, "Router: the largest n a request may ask for.");
ABSL_FLAG(int64_t, router_generate_timeout_ms, 600000, "Router: deadline of one request on its decode worker.");

namespace kvmesh::cli {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh router: %s\n", message.c_str());
  return 1;
}

}  // namespace

int RunRouter(int argc, char** argv) {
  BlockStopSignals();  // before any thread starts: they inherit the mask

  ParseSubcommandFlags(argc, argv,
                       "kvmesh router --scheduler HOST:PORT [--model DIR] [--host H --port P]: the cluster's "
                       "OpenAI-compatible REST front door",
                       {"router_command"});
  const std::string scheduler = absl::GetFlag(FLAGS_scheduler);
  if (scheduler.empty()) return Fail("--scheduler is required");
  const std::string model_dir = ModelDirFlag();
  auto config = model::LoadModelConfig(model_dir);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  auto tokenizer = model::Tokenizer::FromDirectory(model_dir);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));

  int32_t max_model_len = absl::GetFlag(FLAGS_max_model_len);
  if (max_model_len <= 0) max_model_len = static_cast<int32_t>(config->max_position_embeddings);
  std::string model_name = absl::GetFlag(FLAGS_served_model_name);
  if (model_name.empty()) model_name = BaseName(model_dir);

  RemoteTokenSourceOptions source_options;
  source_options.scheduler_address = scheduler;
  source_options.model = model_name;
  source_options.limits.vocab_size = static_cast<int32_t>(config->vocab_size);
  source_options.limits.max_model_len = max_model_len;
  source_options.limits.max_num_seqs = absl::GetFlag(FLAGS_router_max_num_seqs);
  // KV capacity is the workers' to check (RESOURCE_EXHAUSTED from them).
  source_options.limits.block_size_tokens = 16;
  source_options.limits.num_kv_blocks = std::numeric_limits<int32_t>::max() / 2;
  source_options.generate_timeout_ms = absl::GetFlag(FLAGS_router_generate_timeout_ms);
  RemoteTokenSource source(source_options);

  metrics::Registry registry;
  auto metrics = serving::ServingMetrics::Create(registry, [] { return engine::EngineStats{}; });
  if (!metrics.ok()) return Fail(std::string(metrics.status().message()));

  std::optional<model::ChatTemplate> chat_template;
  if (auto t = model::ChatTemplate::FromModelDirectory(model_dir); t.ok()) {
    chat_template = *t;
  } else {
    KVMESH_LOG(kWarning) << "no chat template; /v1/chat/completions will refuse requests"
                         << LogKv("reason", t.status().message());
  }
  serving::OpenAiServiceOptions service_options;
  service_options.model_name = model_name;
  service_options.max_model_len = max_model_len;
  service_options.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight_requests);
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    service_options.api_keys.emplace_back(key);
  }
  service_options.eos_token_ids = config->eos_token_ids;
  if (auto id = (*tokenizer)->eos_token_id();
      id && std::find(service_options.eos_token_ids.begin(), service_options.eos_token_ids.end(), *id) ==
                service_options.eos_token_ids.end()) {
    service_options.eos_token_ids.push_back(*id);
  }
  serving::OpenAiService service(service_options, **tokenizer, chat_template, source, metrics->get());

  auto server = http::HttpServer::Create({.address = absl::GetFlag(FLAGS_host),
                                          .port = static_cast<uint16_t>(absl::GetFlag(FLAGS_port)),
                                          .num_threads = absl::GetFlag(FLAGS_http_threads)});
  if (!server.ok()) return Fail(std::string(server.status().message()));
  serving::RegisterOpenAiRoutes(**server, service, registry);
  if (auto s = (*server)->Start(); !s.ok()) return Fail(std::string(s.message()));
  KVMESH_LOG(kInfo) << "router listening on http://" << absl::GetFlag(FLAGS_host) << ":" << (*server)->port()
                    << LogKv("model", model_name) << LogKv("scheduler", scheduler);

  const int signal = WaitForStopSignal();
  KVMESH_LOG(kInfo) << "draining" << LogKv("signal", signal) << LogKv("inflight", source.num_inflight());
  service.StartDraining();
  if (!source.WaitIdle(absl::GetFlag(FLAGS_drain_timeout_ms))) {
    KVMESH_LOG(kWarning) << "drain deadline passed; cancelling" << LogKv("inflight", source.num_inflight());
  }
  (*server)->Shutdown(std::chrono::milliseconds(5000));
  KVMESH_LOG(kInfo) << "stopped";
  return 0;
}

}  // namespace kvmesh::cli
