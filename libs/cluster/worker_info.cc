#include "cluster/worker_info.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace kvmesh::cluster {

std::string_view WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill: return "prefill";
    case WorkerRole::kDecode: return "decode";
    case WorkerRole::kBoth: return "both";
  }
  return "unknown";
}

absl::Status KvCacheSpec::Validate() const {
  if (block_size_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_spec.block_size_tokens: must be >= 1, got ", block_size_tokens));
  }
  if (tp_size < 1) return absl::InvalidArgumentError(absl::StrCat("kv_cache_spec.tp_size: must be >= 1, got ", tp_size));
  if (num_layers < 0 || num_kv_heads < 0 || head_dim < 0) {
    return absl::InvalidArgumentError("kv_cache_spec: num_layers, num_kv_heads and head_dim must be >= 0");
  }
  return absl::OkStatus();
}

std::string KvCacheSpec::DebugString() const {
  return absl::StrFormat("block_size=%d layers=%d kv_heads=%d head_dim=%d dtype=%s tp=%d salt=%#x", block_size_tokens,
                         num_layers, num_kv_heads, head_dim, ToAbsl(DTypeName(dtype)), tp_size, block_hash_salt);
}

double WorkerLoad::kv_usage() const {
  if (kv_blocks_total <= 0) return 0.0;
  return std::clamp(static_cast<double>(kv_blocks_used) / static_cast<double>(kv_blocks_total), 0.0, 1.0);
}

absl::Status WorkerRegistration::Validate() const {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
  if (address.empty()) return absl::InvalidArgumentError(absl::StrCat("address: empty for worker ", worker_id));
  if (model.empty()) return absl::InvalidArgumentError(absl::StrCat("model: empty for worker ", worker_id));
  return kv_cache_spec.Validate();
}

}  // namespace kvmesh::cluster
