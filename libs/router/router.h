// Router: the cluster's front door (docs/architecture.md §1) assembled from its parts —
// the OpenAI-compatible REST API (serving::OpenAiService, /metrics) and the gRPC
// kvmesh.v1.Inference API (serving::GrpcInferenceService, with health and
// reflection), both over one RemoteTokenSource: each request is placed by the
// scheduler and streamed from the chosen decode worker. Loads the model's config and
// tokenizer, not its weights.
//
//   auto router = Router::Start(options);        // serving once this returns
//   ... wait for SIGTERM ...
//   router->Drain(/*timeout_ms=*/30000);         // refuse new requests, finish running ones
//   router.reset();                              // stop the servers, cancel what is left
//
// Thread-safety: Start, Drain and destruction from one controlling thread; the
// accessors from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "http/http_server.h"
#include "metrics/registry.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "router/remote_token_source.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
#include "rpc/grpc_server.h"
#include "serving/grpc_inference_service.h"
#include "serving/openai_service.h"
#include "serving/serving_metrics.h"

namespace kvmesh::router {

class Router {
 public:
  // Loads the model directory's config and tokenizer and starts both servers.
  // InvalidArgument for bad options or model files; Unavailable when a port cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<Router>> Start(const RouterOptions& options);
  // Stops the servers (running calls get 5 s) and cancels what is left on the workers.
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  int http_port() const { return http_server_->port(); }
  // -1 without gRPC.
  int grpc_port() const { return grpc_server_ ? grpc_server_->port() : -1; }
  const std::string& model_name() const { return model_name_; }
  int64_t num_inflight() const { return source_->num_inflight(); }

  // Graceful drain: gRPC health NOT_SERVING, /health 503, new requests refused (503 /
  // UNAVAILABLE), running ones continue. Returns true once none is left, false when
  // `timeout_ms` passed first (the rest are cancelled on destruction).
  bool Drain(int64_t timeout_ms);

 private:
  Router() = default;

  std::string model_name_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> chat_template_;
  metrics::Registry registry_;
  std::unique_ptr<serving::ServingMetrics> serving_metrics_;
  std::unique_ptr<RouterMetrics> router_metrics_;
  std::unique_ptr<serving::AdmissionController> admission_;  // shared by both front doors; outlives them
  std::unique_ptr<RemoteTokenSource> source_;
  std::unique_ptr<serving::OpenAiService> rest_service_;
  std::unique_ptr<serving::GrpcInferenceService> grpc_service_;
  std::unique_ptr<http::HttpServer> http_server_;
  std::unique_ptr<rpc::GrpcServer> grpc_server_;
};

}  // namespace kvmesh::router
