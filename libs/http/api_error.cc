#include "http/api_error.h"

#include <nlohmann/json.hpp>

#include "core/retry_after.h"

namespace kvmesh::http {

ApiError ApiError::Invalid(std::string param, std::string message) {
  ApiError error;
  error.param = std::move(param);
  error.message = std::move(message);
  return error;
}

int32_t HttpStatusFromStatusCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

std::string_view ErrorTypeForHttpStatus(int32_t http_status) {
  switch (http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    case 504: return "timeout_error";
    default: break;
  }
  if (http_status >= 400 && http_status < 500) return kInvalidRequestError;
  return "server_error";
}

ApiError ApiErrorFromStatus(const absl::Status& status, std::string param) {
  ApiError error;
  error.http_status = HttpStatusFromStatusCode(status.code());
  if (error.http_status < 400) error.http_status = 500;  // an OK status is no error: a bug upstream
  error.type = std::string(ErrorTypeForHttpStatus(error.http_status));
  error.param = std::move(param);
  error.message = std::string(status.message());
  if (error.message.empty()) error.message = status.ToString();
  if (status.code() == absl::StatusCode::kResourceExhausted) error.code = "rate_limit_exceeded";
  if (const std::optional<int64_t> retry_after = RetryAfterSeconds(status)) error.retry_after_s = *retry_after;
  return error;
}

std::string ApiErrorJson(const ApiError& error) {
  nlohmann::ordered_json inner;
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = error.param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(error.param);
  inner["code"] = error.code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(error.code);
  nlohmann::ordered_json out;
  out["error"] = std::move(inner);
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

HttpResponse ApiErrorResponse(const ApiError& error) {
  HttpResponse response = HttpResponse::Json(error.http_status, ApiErrorJson(error));
  if (error.retry_after_s > 0) response.headers.Set("Retry-After", std::to_string(error.retry_after_s));
  return response;
}

}  // namespace kvmesh::http
