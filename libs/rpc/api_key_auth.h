// API keys on gRPC calls: the "authorization: Bearer <key>" metadata checked against a
// service's configured keys (core/api_key.h's constant-time match), for every gRPC
// service that takes --api_keys (the Inference front door, the kv-store).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace kvmesh::rpc {

// The key the call presents: "" when `keys` is empty (no API keys configured), else
// one of `keys`. Unauthenticated when the call carries none of them.
absl::StatusOr<std::string> AuthenticateApiKey(const grpc::ServerContextBase& context,
                                               const std::vector<std::string>& keys);

}  // namespace kvmesh::rpc
