// API-key authentication shared by the REST and gRPC front doors and the kv-store: all
// take the key as "Bearer <key>" (the HTTP Authorization header, the gRPC
// "authorization" metadata).
//
// NOTE: the comparison runs in constant time with respect to the presented key's
// content: every configured key is compared, every byte of it, with no early exit,
// so the time a guess takes does not reveal how many of its leading bytes were right.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvmesh {

// True when `a` and `b` are equal; the time depends only on b.size() (the secret's
// length, not the guess).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The key of `authorization` ("Bearer <key>") when it is one of `keys`; nullopt otherwise.
std::optional<std::string> MatchBearerKey(std::string_view authorization, const std::vector<std::string>& keys);

}  // namespace kvmesh
