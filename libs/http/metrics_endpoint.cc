#include "http/metrics_endpoint.h"

#include <cstdint>

#include "core/logging.h"
#include "core/status_macros.h"
#include "metrics/text_format.h"

namespace kvmesh::http {

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsEndpoint(const std::string& host, int port,
                                                                 const metrics::Registry& registry,
                                                                 std::string_view service) {
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> server,
                          HttpServer::Create({.address = host, .port = static_cast<uint16_t>(port), .num_threads = 1}));
  server->Handle("GET", "/metrics", [&registry](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
    (void)writer->Send(HttpResponse::Text(200, registry.Exposition(), std::string(metrics::kExpositionContentType)));
  });
  server->Handle("GET", "/health", [](HttpRequest, std::shared_ptr<ResponseWriter> writer) {
    (void)writer->Send(HttpResponse::Json(200, R"({"status":"ok"})"));
  });
  KVMESH_RETURN_IF_ERROR(server->Start());
  KVMESH_LOG(kInfo) << service << " metrics on http://" << host << ":" << server->port() << "/metrics";
  return server;
}

}  // namespace kvmesh::http
