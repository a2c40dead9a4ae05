// HTTP/1.1 request parsing as a client reaches it: the bytes go to a real HttpServer on
// 127.0.0.1 over TCP, and the server must answer (or close) without crashing; a second,
// well-formed request on a fresh connection must still be served afterwards (every
// 256 inputs, to keep the rate up).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "http/http_server.h"

namespace {

kvmesh::http::HttpServer& Server() {
  static const std::unique_ptr<kvmesh::http::HttpServer> server = [] {
    auto s = kvmesh::http::HttpServer::Create({.address = "127.0.0.1", .port = 0, .num_threads = 1,
                                               .max_body_bytes = 1 << 16, .max_header_bytes = 8 << 10,
                                               .header_timeout_ms = 2000, .read_timeout_ms = 2000,
                                               .idle_timeout_ms = 2000});
    if (!s.ok()) std::abort();
    (*s)->Handle("POST", "/v1/completions",
                 [](kvmesh::http::HttpRequest request, std::shared_ptr<kvmesh::http::ResponseWriter> writer) {
                   (void)writer->Send(kvmesh::http::HttpResponse::Json(200, "{}"));
                 });
    (*s)->Handle("GET", "/health", [](kvmesh::http::HttpRequest, std::shared_ptr<kvmesh::http::ResponseWriter> w) {
      (void)w->Send(kvmesh::http::HttpResponse::Json(200, R"({"status":"ok"})"));
    });
    if (!(*s)->Start().ok()) std::abort();
    return *std::move(s);
  }();
  return *server;
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "http_request_fuzz: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

// Sends `bytes`, half-closes, and reads until the server closes (or 3 s pass).
// Returns what came back. Every call retries on EINTR: libFuzzer's -timeout watchdog is
// a SIGALRM that interrupts whatever syscall is running (a CI run once aborted on an
// interrupted connect(), and an interrupted poll() would have read as a dead server).
std::string Exchange(const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(Server().port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // An interrupted connect() goes on in the background: wait for it and read its outcome.
  // A refused connection means the server stopped listening: a finding, not a retry.
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINTR) Die("connect to the server");
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    while (poll(&p, 1, 3000) < 0 && errno == EINTR) {
    }
    int error = 0;
    socklen_t length = sizeof(error);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) Die("SO_ERROR");
    if (error != 0 || (p.revents & POLLOUT) == 0) {
      errno = error != 0 ? error : ETIMEDOUT;
      Die("connect to the server (after EINTR)");
    }
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may close early (a bad request): fine
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply;
  char buffer[4096];
  for (;;) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = poll(&p, 1, 3000);
    if (ready < 0 && errno == EINTR) continue;  // the SIGALRM again: not the server's answer
    if (ready <= 0) break;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int inputs = 0;
  (void)Exchange(std::string(reinterpret_cast<const char*>(data), size));
  if (++inputs % 256 == 0) {
    const std::string reply = Exchange("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if (reply.rfind("HTTP/1.1 200", 0) != 0) __builtin_trap();  // the server stopped serving
  }
  return 0;
}
