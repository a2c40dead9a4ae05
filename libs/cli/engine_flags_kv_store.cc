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
#include "kv_store/store_data_plane.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "core/huge_pages.h"

ABSL_FLAG(std::string, kv_store, "",
          "Cluster KV stores (host:port, comma-separated) below the host tier: prefixes computed on any worker are "
          "loaded here instead of recomputed; needs --kv-host-cache-bytes. Empty: off.");
ABSL_FLAG(std::string, kv_store_api_key, "", "API key sent to the KV stores (their --api_keys); empty: none");
ABSL_FLAG(int64_t, kv_store_lookup_timeout_ms, 200,
          "A KV-store lookup a request waits for longer than this is a miss (the prefix is recomputed)");
KVMESH_FLAG_RANGE(kv_store_lookup_timeout_ms, 1, 60000);
ABSL_FLAG(int64_t, kv_store_load_timeout_ms, 2000, "A KV-store load slower than this is recomputed instead");
ABSL_FLAG(std::string, kv_store_data_plane, "grpc",
          "How KV-store block bytes move: grpc (inside the calls) or ucx (one-sided UCX transfers between the host "
          "tier and stores started with --data_plane=ucx and a --block_bytes equal to this worker's host slot; "
          "the gRPC stream for the rest and whenever a transfer fails)");
ABSL_FLAG(std::string, kv_store_ucx_tls, "",
          "UCX_TLS of the KV-store data plane (e.g. \"sm\", \"tcp\"); empty: the UCX_TLS environment variable, "
          "else UCX's choice");
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
  const std::string data_plane = absl::GetFlag(FLAGS_kv_store_data_plane);
  if (data_plane != "grpc" && data_plane != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("--kv-store-data-plane must be grpc or ucx, got '", data_plane, "'"));
  }
  // The data plane registers the host tier's memory: learn where it is when it is
  // allocated (before make_connectors runs), around whatever allocates it.
  struct HostRegion {
    std::byte* base = nullptr;
    int64_t bytes = 0;
  };
  auto region = std::make_shared<HostRegion>();
  if (data_plane == "ucx") {
    std::function<std::byte*(int64_t)> allocate = tiers->host_allocate;
    if (!allocate) {  // the host tier's own choice: huge pages, touched now
      allocate = [](int64_t bytes) {
        std::byte* p = AllocateHugePageMemory(bytes).release();
        for (size_t i = 0; p != nullptr && i < RoundUpToHugePages(bytes); i += 4096) p[i] = std::byte{0};
        return p;
      };
      tiers->host_deallocate = [](std::byte* p) { std::free(p); };
    }
    tiers->host_allocate = [allocate, region](int64_t bytes) {
      std::byte* p = allocate(bytes);
      *region = {.base = p, .bytes = p != nullptr ? bytes : 0};
      return p;
    };
  }
  const std::string ucx_tls = absl::GetFlag(FLAGS_kv_store_ucx_tls);
  const int64_t lookup_ms = absl::GetFlag(FLAGS_kv_store_lookup_timeout_ms);
  const int64_t load_ms = absl::GetFlag(FLAGS_kv_store_load_timeout_ms);
  // NOTE: the model is named by the fingerprint the disk tier salts its records with
  // (its files' names and sizes), not its served name: two models served under one name
  // never share a key, one model under two names does.
  const std::string model_name = absl::StrFormat("%016x", tiers->model_identity);
  tiers->make_connectors = [client_options, model_name, kv_heads_per_rank, head_dim = config.head_dim, tp_size,
                            block_size_tokens, lookup_ms, load_ms, region, ucx_tls](const engine::KvSlotShape& shape,
                                                                                   int64_t slot_bytes)
      -> absl::StatusOr<std::vector<std::unique_ptr<kv::KvConnector>>> {
    kv_store::KvStoreClientOptions with_plane = client_options;
    std::unique_ptr<kv::KvTransport> transport;
    if (region->base != nullptr) {
      KVMESH_ASSIGN_OR_RETURN(transport, kv::UcxKvTransport::Create({.tls = ucx_tls, .checksum_runs = false}));
      KVMESH_ASSIGN_OR_RETURN(with_plane.data_plane,
                              kv_store::RegisterDataPlane(*transport, region->base, slot_bytes,
                                                          static_cast<int32_t>(region->bytes / slot_bytes)));
    }
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv_store::KvStoreClient> client,
                            kv_store::KvStoreClient::Create(with_plane));
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
                            kv_store::KvStoreConnector::Create(std::move(client), options, std::move(transport)));
    std::vector<std::unique_ptr<kv::KvConnector>> out;
    out.push_back(std::move(connector));
    return out;
  };
  return absl::OkStatus();
}

}  // namespace kvmesh::cli
