// --kv-store and its companions: a worker (or `kvmesh serve`) reads and writes the
// cluster KV store (services/kv_store) below its host tier, through a
// kv_store::KvStoreConnector that the engine builds once it knows its slot shape
// (engine::EngineKvTierOptions::make_connectors). Calls to the stores use the
// process's transport security (--tls-*: mutual TLS when configured) and
// --kv-store-api-key. (The file's name starts with engine_flags so that --help lists
// these with the other engine flags.)
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/llama_model.h"

namespace kvmesh::cli {

// Sets tiers->make_connectors when --kv-store names stores. InvalidArgument naming the
// flag for a malformed address list or timeout, and for --kv-store without
// --kv-host-cache-bytes (a loaded block lands in the host tier) or without prefix
// caching. `tp_size`: the worker's tensor-parallel degree (its host slots hold every
// rank's shard, rank-major: the key's scope says so); `block_size_tokens`: --block-size.
absl::Status AddKvStoreFromFlags(const engine::LlamaModel& model, int tp_size, int32_t block_size_tokens,
                                 bool prefix_caching, engine::EngineKvTierOptions* tiers);

}  // namespace kvmesh::cli
