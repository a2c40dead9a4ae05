// The rule for a request's cache_salt (vLLM's field), shared by both front doors (REST,
// gRPC) and the engine's admission check. What the salt does is kv/block_hash.h's.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace kvmesh {

// NOTE: vLLM sets no bound. The salt rides in every hop of a request (router,
// scheduler, prefill and decode workers) and is hashed once per request; 1 KiB holds
// any tenant id or a 256-bit secret in any encoding many times over while keeping what
// one request may push through every hop small.
inline constexpr size_t kMaxCacheSaltBytes = 1024;

// A salt the client sent (present): InvalidArgument when empty (vLLM's wording) or
// longer than kMaxCacheSaltBytes; both messages name cache_salt.
absl::Status ValidateCacheSalt(std::string_view cache_salt);

}  // namespace kvmesh
