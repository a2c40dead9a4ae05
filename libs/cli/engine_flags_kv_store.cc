#include "cli/engine_flags_kv_store.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/flag_checks.h"
#include "core/host_port.h"
#include "core/status_macros.h"
#include "kv/kv_block_spec.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/kv_store_connector.h"

ABSL_FLAG(std::string, kv_store, "",
          "Cluster KV stores (host:port, comma-separated) below the host tier: prefixes computed on any worker are "
          "loaded here instead of recomputed; needs --kv-host-cache-bytes. Empty: off.");
ABSL_FLAG(std::string, kv_store_api_key, "", "API key sent to the KV stores (their --api_keys); empty: none");
ABSL_FLAG(int64_t, kv_store_lookup_timeout_ms, 200,
          "A KV-store lookup a request waits for longer than this is a miss (the prefix is recomputed)");
KVMESH_FLAG_RANGE(kv_store_lookup_timeout_ms, 1, 60000);
ABSL_FLAG(int64_t, kv_store_load_timeout_ms, 2000, "A KV-store load slower than this is recomputed instead");
KVMESH_FLAG_RANGE(kv_store_load_timeout_ms, 1, 600000);

namespace kvmesh::cli {

absl::Status AddKvStoreFromFlags(const engine::LlamaModel& model, int tp_size, int32_t block_size_tokens,
                                 bool prefix_caching, engine::EngineKvTierOptions* tiers) {
  const std::string list = absl::GetFlag(FLAGS_kv_store);
  if (list.empty()) return absl::OkStatus();
  std::vector<std::string> addresses;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    const std::string address(absl::StripAsciiWhitespace(part));
    if (absl::Status s = ParseHostPort(address).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-store: '", address, "': ", s.message()));
    }
    addresses.push_back(address);
  }
  if (tiers->host_cache_bytes <= 0) {
    return absl::InvalidArgumentError("--kv-store needs --kv-host-cache-bytes: blocks read from a store land in the host tier");
  }
  if (!prefix_caching) {
    return absl::InvalidArgumentError("--kv-store needs prefix caching: blocks are found by their hashes");
  }
  const model::ModelConfig& config = model.config();
  const int32_t kv_heads_per_rank =
      static_cast<int32_t>(std::max<int64_t>(1, config.num_key_value_heads / std::max(tp_size, 1)));
  kv_store::KvStoreClientOptions client_options{.addresses = addresses,
                                                .api_key = absl::GetFlag(FLAGS_kv_store_api_key)};
  // Probe the addresses now: a malformed or duplicated list is a start-up error.
  KVMESH_RETURN_IF_ERROR(kv_store::KvStoreClient::Create(client_options).status());
  const int64_t lookup_ms = absl::GetFlag(FLAGS_kv_store_lookup_timeout_ms);
  const int64_t load_ms = absl::GetFlag(FLAGS_kv_store_load_timeout_ms);
  // NOTE: the model is named by the fingerprint the disk tier salts its records with
  // (its files' names and sizes), not its served name: two models served under one name
  // never share a key, one model under two names does.
  const std::string model_name = absl::StrFormat("%016x", tiers->model_identity);
  tiers->make_connectors = [client_options, model_name, kv_heads_per_rank, head_dim = config.head_dim, tp_size,
                            block_size_tokens, lookup_ms, load_ms](const engine::KvSlotShape& shape, int64_t slot_bytes)
      -> absl::StatusOr<std::vector<std::unique_ptr<kv::KvConnector>>> {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv_store::KvStoreClient> client,
                            kv_store::KvStoreClient::Create(client_options));
    kv_store::KvStoreConnectorOptions options{
        .scope = {.model = model_name,
                  .block_spec = {.num_layers = shape.num_layers,
                                 .num_kv_heads = kv_heads_per_rank,
                                 .head_dim = static_cast<int32_t>(head_dim),
                                 .block_size_tokens = block_size_tokens,
                                 .dtype = static_cast<DType>(shape.dtype),
                                 .block_bytes = shape.block_bytes},
                  .tp_rank = 0,
                  .tp_size = tp_size},
        .block_bytes = slot_bytes,
        .lookup_timeout_ms = lookup_ms,
        .load_timeout_ms = load_ms};
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv_store::KvStoreConnector> connector,
                            kv_store::KvStoreConnector::Create(std::move(client), options));
    std::vector<std::unique_ptr<kv::KvConnector>> out;
    out.push_back(std::move(connector));
    return out;
  };
  return absl::OkStatus();
}

}  // namespace kvmesh::cli
