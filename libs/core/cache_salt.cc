#include "core/cache_salt.h"

#include "absl/strings/str_cat.h"

namespace kvmesh {

absl::Status ValidateCacheSalt(std::string_view cache_salt) {
  // vLLM's wording (vllm/entrypoints/openai/protocol.py).
  if (cache_salt.empty()) {
    return absl::InvalidArgumentError("Parameter 'cache_salt' must be a non-empty string if provided.");
  }
  if (cache_salt.size() > kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(absl::StrCat("Parameter 'cache_salt' must be at most ", kMaxCacheSaltBytes,
                                                   " bytes, got ", cache_salt.size(), "."));
  }
  return absl::OkStatus();
}

}  // namespace kvmesh
