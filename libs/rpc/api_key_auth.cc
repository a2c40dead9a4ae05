#include "rpc/api_key_auth.h"

#include <optional>
#include <string_view>

#include <grpcpp/server_context.h>

#include "core/api_key.h"

namespace kvmesh::rpc {

absl::StatusOr<std::string> AuthenticateApiKey(const grpc::ServerContextBase& context,
                                               const std::vector<std::string>& keys) {
  if (keys.empty()) return std::string();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it != metadata.end()) {
    const std::string_view value(it->second.data(), it->second.size());
    if (std::optional<std::string> key = MatchBearerKey(value, keys)) return *std::move(key);
  }
  return absl::UnauthenticatedError(
      "incorrect or missing API key: pass it as 'authorization: Bearer <key>' metadata");
}

}  // namespace kvmesh::rpc
