// How much host memory is available, for sizing pools from a fraction of it
// (vLLM's --gpu-memory-utilization, for the CPU backend's KV pool).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvmesh {

// MemAvailable from /proc/meminfo, in bytes. Unavailable if it cannot be read.
absl::StatusOr<int64_t> AvailableHostMemoryBytes();

// Parses the text of /proc/meminfo; InvalidArgument if it has no MemAvailable line.
absl::StatusOr<int64_t> ParseMemAvailableBytes(const std::string& meminfo);

}  // namespace kvmesh
