// ApiError: an OpenAI-style error, and the ONE place where an absl::Status becomes
// an HTTP status (docs/development.md, "Conventions": a Status becomes gRPC or HTTP in exactly one place).
//
//   {"error":{"message":"...","type":"invalid_request_error","param":"top_p","code":null}}
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "http/http_types.h"

namespace kvmesh::http {

inline constexpr std::string_view kInvalidRequestError = "invalid_request_error";

struct ApiError {
  int32_t http_status = 400;
  std::string type = std::string(kInvalidRequestError);
  std::string param;  // the offending field ("messages[1].content"); "" renders as null
  std::string message;
  std::string code;   // machine-readable code; "" renders as null
  int64_t retry_after_s = 0;  // > 0: sent as a Retry-After header

  // A 400 invalid_request_error about `param`.
  static ApiError Invalid(std::string param, std::string message);
};

// absl::StatusCode → HTTP status: InvalidArgument 400, Unauthenticated 401,
// PermissionDenied 403, NotFound 404, ResourceExhausted 429, Unavailable 503,
// DeadlineExceeded 504, OK 200, everything else 500.
int32_t HttpStatusFromStatusCode(absl::StatusCode code);

// The OpenAI error `type` for an HTTP status: 400 invalid_request_error,
// 401 authentication_error, 403 permission_error, 404 not_found_error,
// 405 invalid_request_error, 413 invalid_request_error, 429 rate_limit_error,
// 503 service_unavailable_error, 504 timeout_error, other 4xx invalid_request_error,
// 5xx server_error.
std::string_view ErrorTypeForHttpStatus(int32_t http_status);

// Maps a non-OK status (its code and message) to an ApiError; `param` names the field
// when the caller knows it. ResourceExhausted gets code "rate_limit_exceeded"; a
// Retry-After attached to the status (core/retry_after.h) becomes retry_after_s.
ApiError ApiErrorFromStatus(const absl::Status& status, std::string param = "");

// `{"error":{"message":..,"type":..,"param":..,"code":..}}`. Invalid UTF-8 in the
// message is replaced, never thrown.
std::string ApiErrorJson(const ApiError& error);

// The full HTTP response for `error` (application/json, with Retry-After when set).
HttpResponse ApiErrorResponse(const ApiError& error);

}  // namespace kvmesh::http
