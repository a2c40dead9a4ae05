// Retry-After on a Status: how long a refused client should wait (rate limits, a full
// server), carried as a Status payload from where the refusal is decided (serving's
// AdmissionController) to the one place that turns a Status into HTTP (http/api_error:
// a Retry-After header) or gRPC (a "retry-after" trailing metadata entry).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace kvmesh {

// Attaches `seconds` (clamped to >= 1) to `status` (a non-OK status; OK is left as is).
void SetRetryAfterSeconds(absl::Status& status, int64_t seconds);

// The seconds attached by SetRetryAfterSeconds, if any.
std::optional<int64_t> RetryAfterSeconds(const absl::Status& status);

}  // namespace kvmesh
