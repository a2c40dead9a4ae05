#include "serving/openai_routes.h"

#include <memory>
#include <string>

#include "metrics/text_format.h"

namespace kvmesh::serving {

void RegisterOpenAiRoutes(http::HttpServer& server, OpenAiService& service, const metrics::Registry& registry) {
  auto route = [&service](void (OpenAiService::*handler)(http::HttpRequest, std::shared_ptr<http::ResponseWriter>)) {
    return [&service, handler](http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
      (service.*handler)(std::move(request), std::move(writer));
    };
  };
  server.Handle("POST", "/v1/completions", route(&OpenAiService::HandleCompletions));
  server.Handle("POST", "/v1/chat/completions", route(&OpenAiService::HandleChatCompletions));
  server.Handle("GET", "/v1/models", route(&OpenAiService::HandleModels));
  server.Handle("GET", "/health", route(&OpenAiService::HandleHealth));
  server.Handle("POST", "/tokenize", route(&OpenAiService::HandleTokenize));
  server.Handle("POST", "/detokenize", route(&OpenAiService::HandleDetokenize));
  server.Handle("GET", "/version", route(&OpenAiService::HandleVersion));
  server.Handle("GET", "/metrics", [&registry](http::HttpRequest, std::shared_ptr<http::ResponseWriter> writer) {
    (void)writer->Send(
        http::HttpResponse::Text(200, registry.Exposition(), std::string(metrics::kExpositionContentType)));
  });
}

}  // namespace kvmesh::serving
