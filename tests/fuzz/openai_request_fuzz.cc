// OpenAI request parsing (/v1/completions and /v1/chat/completions bodies): any body
// parses to a request or an ApiError with a 4xx status and a message.
#include <string_view>
#include <variant>

#include "http/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto check = [](const auto& parsed) {
    if (const auto* error = std::get_if<kvmesh::http::ApiError>(&parsed)) {
      if (error->http_status < 400 || error->http_status >= 500 || error->message.empty()) __builtin_trap();
    }
  };
  if (data[0] & 1) {
    check(kvmesh::http::ParseChatCompletionRequest(body));
  } else {
    check(kvmesh::http::ParseCompletionRequest(body));
  }
  return 0;
}
