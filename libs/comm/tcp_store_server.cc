#include "comm/tcp_store_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/internal/socket_io.h"

namespace kvmesh::comm {
namespace {

// A request the server could not parse or a peer that vanished ends only that connection.
constexpr absl::Duration kIoTimeout = absl::Seconds(30);

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const TcpStoreServerOptions& options) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.bind_host.c_str(), &addr.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat("TCP store: bind host \"", options.bind_host, "\" is not IPv4"));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("TCP store: socket: ", strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    const std::string error = strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("TCP store: cannot listen on ", options.bind_host, ":", options.port, ": ", error));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(options.bind_host, fd, ntohs(addr.sin_port)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  Stop();
  close(listen_fd_);
}

std::string TcpStoreServer::address() const { return absl::StrCat(host_, ":", port_); }

void TcpStoreServer::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    // shutdown() wakes a thread blocked in accept() or poll() on these sockets.
    shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : client_fds_) shutdown(fd, SHUT_RDWR);
  }
  accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads.swap(client_threads_);
  }
  for (std::thread& t : threads) t.join();
}

void TcpStoreServer::AcceptLoop() {
  while (true) {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      if (fd >= 0) close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  while (true) {
    // A connection idles between rendezvous steps: wait for the next request without limit
    // (Stop() shuts the socket down), then read the rest of it under a timeout.
    absl::StatusOr<internal::Frame> request = internal::ReadFrame(fd, absl::InfiniteFuture());
    if (!request.ok()) break;
    internal::Frame reply{.op = 'K'};
    if (request->op == 'S') {
      absl::MutexLock lock(&mu_);
      values_[request->key] = std::move(request->value);
    } else if (request->op == 'G') {
      int64_t timeout_ms = 0;
      if (!absl::SimpleAtoi(request->value, &timeout_ms)) break;
      const std::string& key = request->key;
      absl::MutexLock lock(&mu_);
      auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || values_.contains(key); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms));
      auto it = values_.find(key);
      if (it == values_.end()) {
        reply.op = 'N';
      } else {
        reply.value = it->second;
      }
    } else {
      break;
    }
    if (!internal::WriteFrame(fd, reply, absl::Now() + kIoTimeout).ok()) break;
  }
  absl::MutexLock lock(&mu_);
  std::erase(client_fds_, fd);
  close(fd);
}

}  // namespace kvmesh::comm
