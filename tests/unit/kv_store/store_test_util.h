// What the tests of the kv-store's clients share: random blocks, and SilentListener, a
// port on 127.0.0.1 that accepts TCP connections and never speaks — a store stopped
// (SIGSTOP) or hung behind a live socket. Destroyed, it closes: its address is then a
// dead store's.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv_store {

// `n` blocks of `bytes` random bytes each, from `seed`.
inline std::vector<std::vector<std::byte>> RandomBlocks(int n, int64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> blocks(static_cast<size_t>(n), std::vector<std::byte>(static_cast<size_t>(bytes)));
  for (auto& b : blocks) {
    for (std::byte& x : b) x = static_cast<std::byte>(rng());
  }
  return blocks;
}

class SilentListener {
 public:
  // `port` 0: a free one; else that one (a store's, just closed: a store that hangs).
  explicit SilentListener(int port = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace kvmesh::kv_store
