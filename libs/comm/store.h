// Store: the key-value rendezvous a communicator group meets through before it can
// talk directly (each rank publishes its address, NCCL's unique id travels through
// it). Keys are written once; readers wait for them.
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvmesh::comm {

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` (overwriting). Unavailable if the store cannot be reached.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key` to be set and returns its value.
  // DeadlineExceeded if it is not set in time; Unavailable if the store is unreachable.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

}  // namespace kvmesh::comm
