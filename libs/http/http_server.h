// HttpServer: an asynchronous HTTP/1.1 server (Boost.Beast/Asio behind a pimpl) for
// the REST front door. One io_context is run by a small thread pool; each connection
// is a strand with its own buffers and no thread, so thousands of open SSE streams
// cost memory, not threads.
//
//   auto server = HttpServer::Create({.port = 0, .num_threads = 2}).value();
//   server->Handle("GET", "/health", [](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
//     w->Send(HttpResponse::Json(200, R"({"status":"ok"})"));
//   });
//   KVMESH_RETURN_IF_ERROR(server->Start());   // server->port() is the bound port
//   ...
//   server->Shutdown(std::chrono::seconds(30));  // graceful drain
//
// Per connection: keep-alive, pipelined requests handled one at a time in order (the
// next request is dispatched after the previous response has been written), a
// background read during each response that detects the client going away (→
// ResponseWriter's on_disconnect). NOTE: as in uvicorn/vLLM, EOF from the client
// while its response is in flight counts as going away, so a client that half-closes
// its sending side after the request loses the response. Errors the server produces itself are OpenAI
// error JSON: 404 unknown path, 405 known path with another method (with Allow),
// 413 body over max_body_bytes, 431 header over max_header_bytes, 400 unparsable
// request, 503 over max_connections, 500 when a handler throws or drops its writer.
//
// Timeouts: header_timeout_ms bounds reading a request's header (from its first
// byte, or from connection open); read_timeout_ms bounds reading its body;
// idle_timeout_ms closes a keep-alive connection with no request in flight. None
// applies while a response is being produced or streamed.
//
// Thread-safety: Handle() before Start(); Start/Shutdown from one controlling thread,
// never from a handler or an I/O thread. port() and num_connections() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/http_types.h"

namespace kvmesh::http {

struct HttpServerOptions {
  std::string address = "127.0.0.1";     // IPv4 or IPv6 literal; "0.0.0.0" for all
  uint16_t port = 0;                      // 0: an ephemeral port, see port()
  int32_t num_threads = 2;                // I/O threads running the io_context
  int64_t max_body_bytes = 8 << 20;       // larger bodies → 413
  int32_t max_header_bytes = 64 << 10;    // larger headers → 431
  int64_t header_timeout_ms = 30'000;
  int64_t read_timeout_ms = 60'000;
  int64_t idle_timeout_ms = 75'000;
  int32_t max_connections = 10'000;       // beyond: 503 and close
  int32_t listen_backlog = 1024;
};

class HttpServer {
 public:
  // InvalidArgument for non-positive threads/limits/timeouts.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(const HttpServerOptions& options);
  ~HttpServer();  // Shutdown(0) when still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes requests with exactly this method (case-sensitive, e.g. "POST") and path
  // (exact, query string excluded) to `handler`. Replaces an earlier route. Before Start().
  void Handle(std::string_view method, std::string_view path, HttpHandler handler);

  // Binds, listens and starts the I/O threads. Unavailable when the address cannot be
  // bound; FailedPrecondition when called twice.
  absl::Status Start();

  // The bound port (after Start()).
  uint16_t port() const;
  // Open connections right now.
  int32_t num_connections() const;

  // Graceful stop: stops accepting, closes idle connections, lets in-flight requests
  // and streams finish (their connections close after the response) until `grace` has
  // passed, then closes what is left (firing on_disconnect) and joins the I/O threads.
  // Idempotent. Writers kept by services stay valid: their writes become no-ops.
  void Shutdown(std::chrono::milliseconds grace);

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvmesh::http
