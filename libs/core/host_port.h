// ParseHostPort: the one parser of "host:port" addresses that kvmesh listens on or dials
// ("0.0.0.0:50052", "[::1]:0", "localhost:8000"). A port outside [0, 65535] is refused
// here instead of wrapping at 65536 further down (gRPC and sockets take 16 bits: port
// 99999 would quietly become 34463).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvmesh {

inline constexpr int32_t kMaxPort = 65535;

struct HostPort {
  std::string host;  // without IPv6 brackets: "::1"
  int32_t port = 0;  // [0, 65535]; 0 asks for a free port when listening
};

// InvalidArgument naming `address` when it has no ":port", an empty host, a port that
// is not a decimal number, or a port outside [0, 65535].
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);

// InvalidArgument unless `port` is in [0, 65535] (`what` names it in the message).
absl::Status CheckPort(int64_t port, std::string_view what);

}  // namespace kvmesh
