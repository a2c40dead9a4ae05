// Blocking socket helpers shared by the TCP store's server and client: whole-buffer
// reads and writes that respect a deadline (poll before each chunk), and the store's
// length-prefixed frames.
//
// Wire format, both directions: [u8 op or status][u32 key length][key][u32 value
// length][value], little-endian lengths. Requests: op 'S' (set key value), op 'G'
// (get key; value holds the decimal timeout in ms). Replies: status 'K' (ok, value)
// or 'N' (not found before the timeout; empty value).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvmesh::comm::internal {

struct Frame {
  char op = 0;
  std::string key;
  std::string value;
};

// Unavailable if the peer closed or the socket failed; DeadlineExceeded at `deadline`.
absl::Status WriteFrame(int fd, const Frame& frame, absl::Time deadline);
absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline);

// A connected TCP socket to host:port, retried until `deadline` (the server may not be
// listening yet). Unavailable/DeadlineExceeded with the address in the message.
absl::StatusOr<int> ConnectTcp(const std::string& host, int port, absl::Time deadline);

// Splits "host:port". InvalidArgument if malformed.
absl::Status ParseHostPort(const std::string& address, std::string* host, int* port);

}  // namespace kvmesh::comm::internal
