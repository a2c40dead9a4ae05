// The vocabulary between libs/http's HttpServer and the handlers that serve it:
// HttpHeaders, HttpRequest, HttpResponse, and ResponseWriter (the reply side of
// one exchange, either one full response or a chunked/SSE stream).
//
// Free of Boost.Beast/Asio types on purpose (a Beast TU costs ~9 s to compile):
// services include this header; only http_server.cc sees Beast.
//
// Thread-safety: HttpHeaders/HttpRequest/HttpResponse are plain values.
// ResponseWriter is thread-safe (see below).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace kvmesh::http {

// Header fields in arrival/insertion order with case-insensitive name lookup.
class HttpHeaders {
 public:
  HttpHeaders() = default;
  HttpHeaders(std::initializer_list<std::pair<std::string, std::string>> fields);

  // Appends a field (a name may repeat).
  void Add(std::string name, std::string value);
  // Replaces every field named `name` (case-insensitively) with one field.
  void Set(std::string name, std::string value);
  // Removes every field named `name`.
  void Remove(std::string_view name);
  // The first field named `name`, case-insensitively.
  std::optional<std::string_view> Get(std::string_view name) const;
  bool Has(std::string_view name) const { return Get(name).has_value(); }

  const std::vector<std::pair<std::string, std::string>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

// ASCII case-insensitive equality (header names, methods, tokens).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

struct HttpRequest {
  std::string method;          // as sent, e.g. "POST"
  std::string target;          // request-target as sent: "/v1/models?x=1"
  std::string path;            // target before '?': "/v1/models"
  std::string query;           // after '?' (no '?'); empty when absent
  int32_t version = 11;        // 10 (HTTP/1.0) or 11 (HTTP/1.1)
  HttpHeaders headers;
  std::string body;
  std::string remote_address;  // "127.0.0.1:54321"

  // The raw (not percent-decoded) value of the first `name=` parameter in `query`;
  // "" for a bare `name`; nullopt when absent.
  std::optional<std::string> QueryParam(std::string_view name) const;
};

struct HttpResponse {
  int32_t status = 200;
  HttpHeaders headers;  // Content-Length and Connection are set by the server
  std::string body;

  static HttpResponse Json(int32_t status, std::string body);
  static HttpResponse Text(int32_t status, std::string body,
                           std::string content_type = "text/plain; charset=utf-8");
};

// ResponseWriter: the reply side of one HTTP exchange. A handler either calls Send()
// once, or StartStream() then any number of Write() and one Finish(). Responses on a
// connection go out in request order (HTTP/1.1 pipelining): the next request on the
// same connection is dispatched only after this response has been fully written.
//
// If the last reference is dropped before a response was started, the server answers
// 500; if dropped mid-stream, the server ends the stream (terminating chunk).
//
// Backpressure: Write() never blocks; it queues. buffered_bytes() says how much is
// queued and not yet accepted by the kernel; NotifyWhenDrained() signals when it is
// all out. A producer that must not outrun a slow client waits for that signal.
//
// Thread-safety: thread-safe; every method may be called from any thread (the engine
// thread produces tokens). Callbacks run on a server I/O thread (or on the calling
// thread when the condition already holds), outside any lock of the writer; they must
// not block. After the client has gone away every write is a no-op.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;

  // Sends one complete response (Content-Length framing). Errors: FailedPrecondition
  // when a response was already started; Cancelled when the client has gone away.
  virtual absl::Status Send(HttpResponse response) = 0;

  // Starts a streaming response: the status line and headers go out now, the body by
  // Write() in chunked transfer encoding (raw, closed at the end, for HTTP/1.0
  // clients). Defaults: Content-Type text/event-stream, Cache-Control no-cache.
  // Errors as Send().
  virtual absl::Status StartStream(int32_t status = 200, HttpHeaders headers = {}) = 0;

  // Queues `chunk` as one HTTP chunk (an empty chunk is ignored, it would end the
  // stream). Returns false, dropping it, when no stream is open: before StartStream,
  // after Finish, or after the client went away.
  virtual bool Write(std::string_view chunk) = 0;

  // Ends the stream (terminating chunk). Idempotent; a no-op after a disconnect.
  virtual void Finish() = 0;

  // Bytes queued by Send/StartStream/Write and not yet accepted by the kernel.
  virtual int64_t buffered_bytes() const = 0;

  // True once the client went away (read EOF/reset, write error, timeout, forced
  // shutdown) before the response was complete.
  virtual bool disconnected() const = 0;

  // One-shot: `callback` runs when the client goes away before the response is
  // complete, so the service can abort its work and free its KV. Runs at once, on the
  // calling thread, when that has already happened. Replaces an earlier callback.
  virtual void SetOnDisconnect(std::function<void()> callback) = 0;

  // One-shot: `callback` runs when buffered_bytes() reaches zero, or the client goes
  // away. Runs at once, on the calling thread, when either already holds.
  virtual void NotifyWhenDrained(std::function<void()> callback) = 0;

  // One-shot: runs with true once the whole response has been written to the socket,
  // with false when it no longer can be (disconnect). At once when already decided.
  virtual void SetOnComplete(std::function<void(bool delivered)> callback) = 0;
};

// Called on a server I/O thread for each routed request; must not block (hand long
// work to another thread with the writer).
using HttpHandler = std::function<void(HttpRequest request, std::shared_ptr<ResponseWriter> writer)>;

}  // namespace kvmesh::http
