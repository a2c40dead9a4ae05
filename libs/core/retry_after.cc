#include "core/retry_after.h"

#include <algorithm>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace kvmesh {
namespace {

constexpr char kRetryAfterUrl[] = "type.kvmesh.dev/retry_after_s";

}  // namespace

void SetRetryAfterSeconds(absl::Status& status, int64_t seconds) {
  if (status.ok()) return;
  status.SetPayload(kRetryAfterUrl, absl::Cord(std::to_string(std::max<int64_t>(1, seconds))));
}

std::optional<int64_t> RetryAfterSeconds(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterUrl);  // absl::optional in Debian's Abseil
  if (!payload) return std::nullopt;
  int64_t seconds = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &seconds)) return std::nullopt;
  return seconds;
}

}  // namespace kvmesh
