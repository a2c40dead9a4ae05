// The REST routes of an OpenAI-compatible front door (kvmesh serve, kvmesh router):
// POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics (the registry's Prometheus text).
#pragma once

#include "http/http_server.h"
#include "metrics/registry.h"
#include "serving/openai_service.h"

namespace kvmesh::serving {

// Before server.Start(). `service` and `registry` must outlive the server.
void RegisterOpenAiRoutes(http::HttpServer& server, OpenAiService& service, const metrics::Registry& registry);

}  // namespace kvmesh::serving
