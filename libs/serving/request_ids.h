// Ids and timestamps of the responses the front doors give out.
//
// NOTE: an id is 128 random bits (hex), not a per-process counter: a counter restarts
// from 1 with the process and repeats across router replicas, so two clients would get
// the same "chatcmpl-1", and two replicas would send the same engine request id to one
// decode worker. 128 bits make a collision out of the question at any request rate.
//
// Thread-safety: thread-safe (each thread draws from its own generator).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvmesh::serving {

// `prefix` followed by 32 lowercase hex digits: "chatcmpl-3f2a...".
std::string NewResponseId(std::string_view prefix);

// Seconds since the Unix epoch now (the `created` of a response: its request's time).
int64_t UnixSecondsNow();

}  // namespace kvmesh::serving
