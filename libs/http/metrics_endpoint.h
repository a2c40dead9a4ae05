// The /metrics endpoint of a service without a REST API of its own (the scheduler, the
// kv-store): an HttpServer answering GET /metrics with a Registry's Prometheus text and
// GET /health with {"status":"ok"}.
//
// Thread-safety: as HttpServer; `registry` must outlive the server.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "http/http_server.h"
#include "metrics/registry.h"

namespace kvmesh::http {

// Binds host:port (port 0: a free one, see HttpServer::port()), starts one I/O thread and
// logs the URL, naming `service`. The errors of HttpServer::Create and Start.
absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsEndpoint(const std::string& host, int port,
                                                                 const metrics::Registry& registry,
                                                                 std::string_view service);

}  // namespace kvmesh::http
