#include "router/router.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "model/model_config.h"
#include "serving/openai_routes.h"

namespace kvmesh::router {
namespace {

// "/models/llama/" -> "llama".
std::string DirectoryName(const std::string& dir) {
  std::filesystem::path path(dir);
  if (!path.has_filename()) path = path.parent_path();
  return path.filename().string();
}

absl::Status Validate(const RouterOptions& o) {
  if (o.scheduler_address.empty()) return absl::InvalidArgumentError("the scheduler's address is required");
  if (o.port < 0 || o.port > 65535) return absl::InvalidArgumentError("the REST port must be in [0, 65535]");
  if (o.grpc_port < -1 || o.grpc_port > 65535) {
    return absl::InvalidArgumentError("the gRPC port must be -1 (off), 0 (any free port) or a port number");
  }
  if (o.max_inflight_requests <= 0 || o.max_num_seqs <= 0 || o.max_attempts <= 0 || o.generate_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        "max_inflight_requests, max_num_seqs, max_attempts and generate_timeout_ms must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Router>> Router::Start(const RouterOptions& options) {
  KVMESH_RETURN_IF_ERROR(Validate(options));
  std::unique_ptr<Router> r(new Router());
  KVMESH_ASSIGN_OR_RETURN(const model::ModelConfig config, model::LoadModelConfig(options.model_dir));
  KVMESH_ASSIGN_OR_RETURN(r->tokenizer_, model::Tokenizer::FromDirectory(options.model_dir));
  if (auto t = model::ChatTemplate::ForModel(options.model_dir, options.chat_template); t.ok()) {
    r->chat_template_ = *t;
  } else if (!options.chat_template.empty() || t.status().code() != absl::StatusCode::kNotFound) {
    return t.status();
  } else {
    KVMESH_LOG(kWarning) << "no chat template; chat requests will be refused" << LogKv("reason", t.status().message());
  }
  const int32_t max_model_len =
      options.max_model_len > 0 ? options.max_model_len : static_cast<int32_t>(config.max_position_embeddings);
  r->model_name_ = options.served_model_name.empty() ? DirectoryName(options.model_dir) : options.served_model_name;
  std::vector<int32_t> eos_token_ids = config.eos_token_ids;
  if (auto id = r->tokenizer_->eos_token_id();
      id && std::find(eos_token_ids.begin(), eos_token_ids.end(), *id) == eos_token_ids.end()) {
    eos_token_ids.push_back(*id);
  }

  // No engine here: the workers export the engine gauges (KV blocks, batch, queue).
  KVMESH_ASSIGN_OR_RETURN(r->serving_metrics_, serving::ServingMetrics::Create(r->registry_, nullptr));
  Router* self = r.get();
  KVMESH_ASSIGN_OR_RETURN(r->router_metrics_, RouterMetrics::Create(r->registry_, [self] {
                            return static_cast<double>(self->source_ ? self->source_->num_inflight() : 0);
                          }));
  RemoteTokenSourceOptions source_options;
  source_options.scheduler_address = options.scheduler_address;
  source_options.model = r->model_name_;
  source_options.limits.vocab_size = static_cast<int32_t>(config.vocab_size);
  source_options.limits.max_model_len = max_model_len;
  source_options.limits.max_num_seqs = options.max_num_seqs;
  // KV capacity is the workers' to check (RESOURCE_EXHAUSTED from them).
  source_options.limits.block_size_tokens = 16;
  source_options.limits.num_kv_blocks = std::numeric_limits<int32_t>::max() / 2;
  // The worker protocol does not carry prompt logprobs back: refuse them rather than drop them.
  source_options.limits.prompt_logprobs_supported = false;
  source_options.generate_timeout_ms = options.generate_timeout_ms;
  source_options.max_attempts = options.max_attempts;
  source_options.placement_view_refresh_ms = options.placement_view_refresh_ms;
  r->source_ = std::make_unique<RemoteTokenSource>(source_options, r->router_metrics_.get());

  serving::AdmissionOptions admission = options.admission;
  admission.max_inflight_sequences = options.max_inflight_requests;
  KVMESH_ASSIGN_OR_RETURN(r->admission_, serving::AdmissionController::Create(std::move(admission)));
  serving::OpenAiServiceOptions rest_options;
  rest_options.admission = r->admission_.get();
  rest_options.model_name = r->model_name_;
  rest_options.max_model_len = max_model_len;
  rest_options.max_inflight_requests = options.max_inflight_requests;
  rest_options.api_keys = options.api_keys;
  rest_options.eos_token_ids = eos_token_ids;
  r->rest_service_ = std::make_unique<serving::OpenAiService>(rest_options, *r->tokenizer_, r->chat_template_,
                                                              *r->source_, r->serving_metrics_.get());
  r->grpc_service_ = std::make_unique<serving::GrpcInferenceService>(
      serving::GrpcInferenceServiceOptions{.model_name = r->model_name_,
                                           .max_model_len = max_model_len,
                                           .max_inflight_requests = options.max_inflight_requests,
                                           .eos_token_ids = eos_token_ids,
                                           .api_keys = options.api_keys,
                                           .admission = r->admission_.get()},
      *r->tokenizer_, r->chat_template_, *r->source_, r->serving_metrics_.get());

  KVMESH_ASSIGN_OR_RETURN(r->http_server_, http::HttpServer::Create({.address = options.host,
                                                                      .port = static_cast<uint16_t>(options.port),
                                                                      .num_threads = options.http_threads}));
  serving::RegisterOpenAiRoutes(*r->http_server_, *r->rest_service_, r->registry_);
  KVMESH_RETURN_IF_ERROR(r->http_server_->Start());
  KVMESH_LOG(kInfo) << "router listening on http://" << options.host << ":" << r->http_server_->port()
                    << LogKv("model", r->model_name_) << LogKv("scheduler", options.scheduler_address);
  if (options.grpc_port >= 0) {
    const std::string host =
        options.host.find(':') != std::string::npos ? absl::StrCat("[", options.host, "]") : options.host;
    KVMESH_ASSIGN_OR_RETURN(r->grpc_server_,
                            rpc::GrpcServer::Start({.address = absl::StrCat(host, ":", options.grpc_port),
                                                    .peers = rpc::PeerAuth::kClients},
                                                   {{r->grpc_service_.get(), v1::Inference::service_full_name()}}));
    KVMESH_LOG(kInfo) << "router grpc listening on " << r->grpc_server_->address();
  }
  return r;
}

Router::~Router() {
  // 1. No new calls; running ones get a grace period, then are cancelled (which
  //    aborts them in the source).
  if (grpc_server_) grpc_server_->Shutdown(/*deadline_ms=*/5000);
  if (http_server_) http_server_->Shutdown(std::chrono::milliseconds(5000));
  // 2. The source cancels what is left and waits for every final output, which the
  //    services' calls need before the services may go.
  source_.reset();
  grpc_service_.reset();
  rest_service_.reset();
}

bool Router::Drain(int64_t timeout_ms) {
  if (grpc_server_) grpc_server_->SetServing(false);  // probes and load balancers look elsewhere
  rest_service_->StartDraining();
  source_->StartDraining();
  if (source_->WaitIdle(timeout_ms)) return true;
  source_->LogInflight();
  return false;
}

}  // namespace kvmesh::router
