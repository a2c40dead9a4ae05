#include "comm/internal/socket_io.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::comm::internal {
namespace {

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status PollUntil(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("TCP store: socket timed out");
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) return absl::UnavailableError(absl::StrCat("TCP store: poll: ", strerror(errno)));
  }
}

absl::Status WriteAll(int fd, const char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    KVMESH_RETURN_IF_ERROR(PollUntil(fd, POLLOUT, deadline));
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("TCP store: send: ", strerror(errno)));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    KVMESH_RETURN_IF_ERROR(PollUntil(fd, POLLIN, deadline));
    const ssize_t r = recv(fd, data, n, 0);
    if (r == 0) return absl::UnavailableError("TCP store: connection closed by peer");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("TCP store: recv: ", strerror(errno)));
    }
    data += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::StatusOr<std::string> ReadString(int fd, absl::Time deadline) {
  unsigned char len[4];
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, reinterpret_cast<char*>(len), 4, deadline));
  const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  // NOTE: rendezvous values are addresses and ids (bytes to kilobytes); a huge length
  // means a stray client speaking another protocol.
  if (n > (64u << 20)) return absl::InvalidArgumentError("TCP store: frame too large");
  std::string s(n, '\0');
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, s.data(), n, deadline));
  return s;
}

}  // namespace

absl::Status WriteFrame(int fd, const Frame& frame, absl::Time deadline) {
  std::string out;
  out.reserve(9 + frame.key.size() + frame.value.size());
  out.push_back(frame.op);
  AppendU32(out, static_cast<uint32_t>(frame.key.size()));
  out += frame.key;
  AppendU32(out, static_cast<uint32_t>(frame.value.size()));
  out += frame.value;
  return WriteAll(fd, out.data(), out.size(), deadline);
}

absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline) {
  Frame frame;
  KVMESH_RETURN_IF_ERROR(ReadAll(fd, &frame.op, 1, deadline));
  KVMESH_ASSIGN_OR_RETURN(frame.key, ReadString(fd, deadline));
  KVMESH_ASSIGN_OR_RETURN(frame.value, ReadString(fd, deadline));
  return frame;
}

absl::Status ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), port) || *port <= 0 ||
      *port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("TCP store address \"", address, "\" is not host:port"));
  *host = address.substr(0, colon);
  return absl::OkStatus();
}

absl::StatusOr<int> ConnectTcp(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port_str = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &found); rc != 0)
    return absl::UnavailableError(absl::StrCat("TCP store: cannot resolve ", host, ": ", gai_strerror(rc)));
  std::string last_error = "no address";
  while (true) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(found);
        return fd;
      }
      last_error = strerror(errno);
      close(fd);
    }
    if (absl::Now() >= deadline) break;
    // The server may not be listening yet (ranks start in any order).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  freeaddrinfo(found);
  return absl::DeadlineExceededError(
      absl::StrCat("TCP store: cannot connect to ", host, ":", port, " (", last_error, ")"));
}

}  // namespace kvmesh::comm::internal
