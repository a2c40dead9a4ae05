#include "http/http_server.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include "core/logging.h"
#include "http/api_error.h"

namespace kvmesh::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Executor = asio::any_io_executor;

namespace {

std::string ToString(beast::string_view s) { return std::string(s.data(), s.size()); }

bool HasCrLf(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

// Status line + headers. The server owns the framing headers (Content-Length,
// Transfer-Encoding, Connection); a handler's copies of those are dropped, as are
// fields containing CR/LF (header injection).
std::string SerializeHead(int32_t status, const HttpHeaders& headers, bool keep_alive,
                          std::optional<size_t> content_length, bool chunked) {
  std::string out;
  out.reserve(256);
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  const beast::string_view reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  out.append(reason.data(), reason.size());
  out += "\r\n";
  for (const auto& [name, value] : headers.entries()) {
    if (EqualsIgnoreCase(name, "content-length") || EqualsIgnoreCase(name, "transfer-encoding") ||
        EqualsIgnoreCase(name, "connection") || HasCrLf(name) || HasCrLf(value) || name.empty()) {
      continue;
    }
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  if (content_length) {
    out += "Content-Length: ";
    out += std::to_string(*content_length);
    out += "\r\n";
  }
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

void AppendChunk(std::string* out, std::string_view data) {
  char size[20];
  const int len = snprintf(size, sizeof(size), "%zx\r\n", data.size());
  out->append(size, static_cast<size_t>(len));
  out->append(data);
  out->append("\r\n");
}

constexpr std::string_view kLastChunk = "0\r\n\r\n";

std::string SerializeError(int32_t status, std::string message, bool keep_alive) {
  ApiError error;
  error.http_status = status;
  error.type = std::string(ErrorTypeForHttpStatus(status));
  error.message = std::move(message);
  HttpResponse response = ApiErrorResponse(error);
  std::string out = SerializeHead(status, response.headers, keep_alive, response.body.size(), false);
  out += response.body;
  return out;
}

}  // namespace

class Connection;
class WriterImpl;

class HttpServer::Impl : public std::enable_shared_from_this<HttpServer::Impl> {
 public:
  explicit Impl(const HttpServerOptions& options)
      : options_(options), ioc_(options.num_threads), acceptor_(asio::make_strand(ioc_)),
        accept_retry_timer_(acceptor_.get_executor()) {}

  const HttpServerOptions& options() const { return options_; }
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  void Handle(std::string_view method, std::string_view path, HttpHandler handler) {
    routes_[std::string(path)][std::string(method)] = std::move(handler);
  }
  absl::Status Start();
  void Shutdown(std::chrono::milliseconds grace);
  uint16_t port() const { return port_.load(); }
  int32_t num_connections() const { return num_connections_.load(); }

  // Routes `request` (called on the connection's strand).
  void Dispatch(HttpRequest request, const std::shared_ptr<ResponseWriter>& writer);
  void Unregister(uint64_t id);

 private:
  void DoAccept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
  std::vector<std::shared_ptr<Connection>> Snapshot();

  const HttpServerOptions options_;
  std::map<std::string, std::map<std::string, HttpHandler>> routes_;  // path → method → handler; fixed after Start
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_timer_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::atomic<uint16_t> port_{0};
  std::atomic<bool> started_{false};
  std::atomic<bool> running_{false};  // Start() succeeded
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int32_t> num_connections_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> connections_;  // guarded by mu_
  uint64_t next_id_ = 0;                                                 // guarded by mu_
};

// One TCP connection. Everything but the constructor runs on its strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<HttpServer::Impl> server, tcp::socket socket, uint64_t id)
      : server_(std::move(server)), socket_(std::move(socket)), executor_(socket_.get_executor()),
        timer_(executor_), id_(id) {
    beast::error_code ec;
    const tcp::endpoint remote = socket_.remote_endpoint(ec);
    if (!ec) remote_address_ = remote.address().to_string() + ":" + std::to_string(remote.port());
  }

  const Executor& executor() const { return executor_; }
  HttpServer::Impl& server() { return *server_; }

  void Start() {
    asio::dispatch(executor_, [self = shared_from_this()] { self->ReadHeader(); });
  }
  void BeginDrain() {
    asio::post(executor_, [self = shared_from_this()] { self->OnDrain(); });
  }
  void ForceClose() {
    asio::post(executor_, [self = shared_from_this()] { self->Close(); });
  }

  // On the strand: response bytes from the current writer; `complete` marks its end.
  void Deliver(std::string bytes, bool complete);

 private:
  enum class Phase { kNone, kHeader, kBody };

  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void ContinueRequest();
  void OnBody(beast::error_code ec);
  void OnRequest();
  void HandleReadError(beast::error_code ec);
  void RespondErrorAndClose(int32_t status, std::string message);
  void OnResponseComplete();
  void OnDrain();
  void Enqueue(std::string bytes);
  void StartWrite();
  void OnWrite(beast::error_code ec, size_t n);
  void ArmTimer(int64_t timeout_ms);
  void CancelTimer();
  void Close();
  // Half-closes, then reads and drops whatever the client still sends (bounded in
  // time) before closing, so that an unread request body does not turn the close into
  // a reset that destroys the response (e.g. a 413) before the client reads it.
  void LingerClose();
  void Discard();
  std::shared_ptr<WriterImpl> NewWriter(bool keep_alive, int32_t version);

  std::shared_ptr<HttpServer::Impl> server_;
  tcp::socket socket_;
  Executor executor_;
  asio::steady_timer timer_;
  const uint64_t id_;
  std::string remote_address_;

  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::kNone;
  bool header_waiting_ = false;       // the next request's header arrived during a response
  bool responding_ = false;           // a request is dispatched and its response not fully written
  bool keep_alive_ = true;            // of the current response
  bool close_after_response_ = false;
  bool drain_ = false;
  bool closed_ = false;
  bool lingering_ = false;
  bool served_any_ = false;
  std::array<char, 4096> discard_buffer_;
  uint64_t timer_generation_ = 0;

  std::weak_ptr<WriterImpl> writer_;  // the current response's writer
  std::string out_;                   // bytes being written
  std::string next_;                  // bytes queued behind out_
  bool writing_ = false;
  uint64_t enqueued_total_ = 0;
  uint64_t written_total_ = 0;
  std::optional<uint64_t> response_end_;  // enqueued_total_ at the current response's end
  uint64_t own_pending_ = 0;              // queued bytes that are the server's (100 Continue)
};

class WriterImpl final : public ResponseWriter, public std::enable_shared_from_this<WriterImpl> {
 public:
  WriterImpl(std::shared_ptr<Connection> connection, bool keep_alive, int32_t version)
      : connection_(std::move(connection)), keep_alive_(keep_alive), chunked_(version >= 11) {}

  ~WriterImpl() override {
    // A dropped writer still owes the client an answer (NOTE: sole owner here, no lock).
    std::string bytes;
    if (!disconnected_ && state_ == State::kIdle) {
      KVMESH_LOG(kWarning) << "http handler dropped its ResponseWriter without responding";
      bytes = SerializeError(500, "the handler produced no response", keep_alive_);
    } else if (!disconnected_ && state_ == State::kStreaming) {
      if (chunked_) bytes = std::string(kLastChunk);
    } else {
      return;
    }
    if (connection_->server().stopped()) return;
    asio::post(connection_->executor(), [c = connection_, bytes = std::move(bytes)]() mutable {
      c->Deliver(std::move(bytes), /*complete=*/true);
    });
  }

  absl::Status Send(HttpResponse response) override {
    std::unique_lock lock(mu_);
    if (disconnected_) return absl::CancelledError("client disconnected");
    if (state_ != State::kIdle) return absl::FailedPreconditionError("response already started");
    const bool keep_alive = keep_alive_ && !connection_->server().draining();
    std::string bytes =
        SerializeHead(response.status, response.headers, keep_alive, response.body.size(), /*chunked=*/false);
    bytes += response.body;
    state_ = State::kDone;
    QueueLocked(std::move(bytes), /*complete=*/true);
    return absl::OkStatus();
  }

  absl::Status StartStream(int32_t status, HttpHeaders headers) override {
    std::unique_lock lock(mu_);
    if (disconnected_) return absl::CancelledError("client disconnected");
    if (state_ != State::kIdle) return absl::FailedPreconditionError("response already started");
    if (!headers.Has("Content-Type")) headers.Add("Content-Type", "text/event-stream");
    if (!headers.Has("Cache-Control")) headers.Add("Cache-Control", "no-cache");
    if (!headers.Has("X-Accel-Buffering")) headers.Add("X-Accel-Buffering", "no");
    // HTTP/1.0 has no chunked encoding: the stream ends when the connection closes.
    const bool keep_alive = chunked_ && keep_alive_ && !connection_->server().draining();
    state_ = State::kStreaming;
    QueueLocked(SerializeHead(status, headers, keep_alive, std::nullopt, chunked_), /*complete=*/false);
    return absl::OkStatus();
  }

  bool Write(std::string_view chunk) override {
    std::unique_lock lock(mu_);
    if (state_ != State::kStreaming || disconnected_) return false;
    if (chunk.empty()) return true;
    const size_t before = pending_.size();
    if (chunked_) {
      AppendChunk(&pending_, chunk);
    } else {
      pending_.append(chunk);
    }
    buffered_bytes_ += static_cast<int64_t>(pending_.size() - before);
    ScheduleFlushLocked();
    return true;
  }

  void Finish() override {
    std::unique_lock lock(mu_);
    if (state_ != State::kStreaming || disconnected_) return;
    state_ = State::kDone;
    QueueLocked(chunked_ ? std::string(kLastChunk) : std::string(), /*complete=*/true);
  }

  int64_t buffered_bytes() const override {
    std::unique_lock lock(mu_);
    return buffered_bytes_;
  }
  bool disconnected() const override {
    std::unique_lock lock(mu_);
    return disconnected_;
  }

  void SetOnDisconnect(std::function<void()> callback) override {
    std::unique_lock lock(mu_);
    if (disconnected_) {
      lock.unlock();
      if (callback) callback();
      return;
    }
    if (!completed_) on_disconnect_ = std::move(callback);
  }

  void NotifyWhenDrained(std::function<void()> callback) override {
    std::unique_lock lock(mu_);
    if (disconnected_ || buffered_bytes_ == 0) {
      lock.unlock();
      if (callback) callback();
      return;
    }
    on_drained_ = std::move(callback);
  }

  void SetOnComplete(std::function<void(bool)> callback) override {
    std::unique_lock lock(mu_);
    if (completed_ || disconnected_) {
      const bool delivered = completed_;
      lock.unlock();
      if (callback) callback(delivered);
      return;
    }
    on_complete_ = std::move(callback);
  }

  // ---- On the connection's strand ----
  void OnBytesWritten(int64_t n) {
    std::function<void()> drained;
    {
      std::unique_lock lock(mu_);
      buffered_bytes_ -= n;
      if (buffered_bytes_ <= 0) {
        buffered_bytes_ = 0;
        drained = std::move(on_drained_);
        on_drained_ = nullptr;
      }
    }
    if (drained) drained();
  }

  void OnDisconnect() {
    std::function<void()> disconnect, drained;
    std::function<void(bool)> complete;
    {
      std::unique_lock lock(mu_);
      if (completed_ || disconnected_) return;
      disconnected_ = true;
      pending_.clear();
      buffered_bytes_ = 0;
      disconnect = std::move(on_disconnect_);
      drained = std::move(on_drained_);
      complete = std::move(on_complete_);
      on_disconnect_ = nullptr;
      on_drained_ = nullptr;
      on_complete_ = nullptr;
    }
    if (drained) drained();
    if (disconnect) disconnect();
    if (complete) complete(false);
  }

  void OnComplete() {
    std::function<void(bool)> complete;
    {
      std::unique_lock lock(mu_);
      if (completed_ || disconnected_) return;
      completed_ = true;
      on_disconnect_ = nullptr;
      complete = std::move(on_complete_);
      on_complete_ = nullptr;
    }
    if (complete) complete(true);
  }

 private:
  enum class State { kIdle, kStreaming, kDone };

  void QueueLocked(std::string bytes, bool complete) {
    buffered_bytes_ += static_cast<int64_t>(bytes.size());
    pending_ += bytes;
    complete_pending_ = complete_pending_ || complete;
    ScheduleFlushLocked();
  }

  void ScheduleFlushLocked() {
    if (flush_scheduled_) return;
    if (connection_->server().stopped()) return;
    flush_scheduled_ = true;
    asio::post(connection_->executor(), [self = shared_from_this()] { self->Flush(); });
  }

  void Flush() {
    std::string bytes;
    bool complete;
    {
      std::unique_lock lock(mu_);
      flush_scheduled_ = false;
      if (disconnected_) return;
      bytes.swap(pending_);
      complete = complete_pending_;
      complete_pending_ = false;
    }
    connection_->Deliver(std::move(bytes), complete);
  }

  const std::shared_ptr<Connection> connection_;
  const bool keep_alive_;
  const bool chunked_;

  mutable std::mutex mu_;
  State state_ = State::kIdle;     // guarded by mu_
  bool disconnected_ = false;      // guarded by mu_
  bool completed_ = false;         // guarded by mu_
  bool flush_scheduled_ = false;   // guarded by mu_
  bool complete_pending_ = false;  // guarded by mu_
  std::string pending_;            // guarded by mu_; framed bytes not yet handed to the connection
  int64_t buffered_bytes_ = 0;     // guarded by mu_
  std::function<void()> on_disconnect_;     // guarded by mu_
  std::function<void()> on_drained_;        // guarded by mu_
  std::function<void(bool)> on_complete_;   // guarded by mu_
};

// ---------------------------------------------------------------------------------
// Connection

std::shared_ptr<WriterImpl> Connection::NewWriter(bool keep_alive, int32_t version) {
  auto writer = std::make_shared<WriterImpl>(shared_from_this(), keep_alive, version);
  writer_ = writer;
  keep_alive_ = keep_alive;
  responding_ = true;
  served_any_ = true;
  return writer;
}

void Connection::ReadHeader() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(server_->options().max_header_bytes));
  parser_->body_limit(static_cast<uint64_t>(server_->options().max_body_bytes));
  phase_ = Phase::kHeader;
  const auto& o = server_->options();
  ArmTimer(served_any_ && buffer_.size() == 0 ? o.idle_timeout_ms : o.header_timeout_ms);
  bhttp::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->OnHeader(ec);
  });
}

void Connection::OnHeader(beast::error_code ec) {
  phase_ = Phase::kNone;
  if (closed_) return;
  if (lingering_) {
    if (ec) {
      Close();
    } else {
      Discard();
    }
    return;
  }
  if (ec) {
    HandleReadError(ec);
    return;
  }
  if (responding_) {  // pipelined: wait for the current response first
    header_waiting_ = true;
    return;
  }
  ContinueRequest();
}

void Connection::ContinueRequest() {
  const auto& o = server_->options();
  if (auto length = parser_->content_length(); length && *length > static_cast<uint64_t>(o.max_body_bytes)) {
    RespondErrorAndClose(413, "request body exceeds " + std::to_string(o.max_body_bytes) + " bytes");
    return;
  }
  if (parser_->is_done()) {
    OnRequest();
    return;
  }
  const auto expect = parser_->get()[bhttp::field::expect];
  if (EqualsIgnoreCase(std::string_view(expect.data(), expect.size()), "100-continue")) {
    constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    own_pending_ += kContinue.size();
    Enqueue(std::string(kContinue));
  }
  phase_ = Phase::kBody;
  ArmTimer(o.read_timeout_ms);
  bhttp::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->OnBody(ec);
  });
}

void Connection::OnBody(beast::error_code ec) {
  phase_ = Phase::kNone;
  if (closed_) return;
  if (ec) {
    HandleReadError(ec);
    return;
  }
  OnRequest();
}

void Connection::OnRequest() {
  CancelTimer();
  auto message = parser_->release();
  parser_.reset();
  HttpRequest request;
  request.method = ToString(message.method_string());
  request.target = ToString(message.target());
  const size_t q = request.target.find('?');
  request.path = request.target.substr(0, q);
  if (q != std::string::npos) request.query = request.target.substr(q + 1);
  request.version = static_cast<int32_t>(message.version());
  for (const auto& field : message) request.headers.Add(ToString(field.name_string()), ToString(field.value()));
  request.body = std::move(message.body());
  request.remote_address = remote_address_;
  const bool keep_alive = message.keep_alive() && !drain_;

  auto writer = NewWriter(keep_alive, request.version);
  // Keep reading: the next (pipelined) header, and EOF/reset = the client went away.
  ReadHeader();
  server_->Dispatch(std::move(request), writer);
}

void Connection::HandleReadError(beast::error_code ec) {
  const bool protocol_error = ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
                              ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
  if (!protocol_error || lingering_) {
    // The peer left (or the timeout closed the socket). Mid-response, that is a
    // disconnect the handler hears about.
    Close();
    return;
  }
  // A protocol error from the parser.
  if (responding_) {
    close_after_response_ = true;  // answer what is in flight, then close
    return;
  }
  if (ec == bhttp::error::body_limit) {
    RespondErrorAndClose(413, "request body exceeds " + std::to_string(server_->options().max_body_bytes) + " bytes");
  } else if (ec == bhttp::error::header_limit) {
    RespondErrorAndClose(431, "request header exceeds " + std::to_string(server_->options().max_header_bytes) + " bytes");
  } else {
    RespondErrorAndClose(400, "malformed HTTP request: " + ec.message());
  }
}

void Connection::RespondErrorAndClose(int32_t status, std::string message) {
  CancelTimer();
  close_after_response_ = true;
  auto writer = NewWriter(/*keep_alive=*/false, 11);
  ApiError error;
  error.http_status = status;
  error.type = std::string(ErrorTypeForHttpStatus(status));
  error.message = std::move(message);
  (void)writer->Send(ApiErrorResponse(error));
}

void Connection::Deliver(std::string bytes, bool complete) {
  if (closed_) return;
  Enqueue(std::move(bytes));
  if (complete && responding_ && !response_end_) response_end_ = enqueued_total_;
  if (response_end_ && written_total_ >= *response_end_ && !writing_) OnResponseComplete();
}

void Connection::Enqueue(std::string bytes) {
  enqueued_total_ += bytes.size();
  if (next_.empty()) {
    next_ = std::move(bytes);
  } else {
    next_ += bytes;
  }
  StartWrite();
}

void Connection::StartWrite() {
  if (writing_ || next_.empty() || closed_) return;
  out_.swap(next_);
  next_.clear();
  writing_ = true;
  asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->OnWrite(ec, n);
  });
}

void Connection::OnWrite(beast::error_code ec, size_t n) {
  writing_ = false;
  if (closed_) return;
  if (ec) {
    Close();
    return;
  }
  written_total_ += n;
  uint64_t writer_bytes = n;
  const uint64_t own = std::min<uint64_t>(own_pending_, writer_bytes);
  own_pending_ -= own;
  writer_bytes -= own;
  if (writer_bytes > 0) {
    if (auto writer = writer_.lock()) writer->OnBytesWritten(static_cast<int64_t>(writer_bytes));
  }
  out_.clear();
  StartWrite();
  if (!writing_ && response_end_ && written_total_ >= *response_end_) OnResponseComplete();
}

void Connection::OnResponseComplete() {
  response_end_.reset();
  responding_ = false;
  if (auto writer = writer_.lock()) writer->OnComplete();
  writer_.reset();
  if (!keep_alive_ || drain_ || close_after_response_) {
    LingerClose();
    return;
  }
  if (header_waiting_) {
    header_waiting_ = false;
    ContinueRequest();
    return;
  }
  if (phase_ == Phase::kHeader) {  // the background read goes on; now under the idle timeout
    const auto& o = server_->options();
    ArmTimer(buffer_.size() == 0 ? o.idle_timeout_ms : o.header_timeout_ms);
  } else if (phase_ == Phase::kNone) {
    ReadHeader();
  }
}

void Connection::LingerClose() {
  if (closed_) return;
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    Close();
    return;
  }
  lingering_ = true;
  const uint64_t generation = ++timer_generation_;
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([self = shared_from_this(), generation](beast::error_code wait_ec) {
    if (!wait_ec && generation == self->timer_generation_) self->Close();
  });
  // A background header read still pending does the discarding (see OnHeader).
  if (phase_ == Phase::kNone) Discard();
}

void Connection::Discard() {
  socket_.async_read_some(asio::buffer(discard_buffer_), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->Close();
      return;
    }
    self->Discard();
  });
}

void Connection::OnDrain() {
  drain_ = true;
  if (closed_ || lingering_ || responding_ || header_waiting_) return;
  // Idle between requests (no partial header buffered): close now. A request being
  // read is served, and its connection closed after the response.
  if (phase_ == Phase::kHeader && buffer_.size() == 0) Close();
}

void Connection::ArmTimer(int64_t timeout_ms) {
  if (responding_ || lingering_) return;
  const uint64_t generation = ++timer_generation_;
  timer_.expires_after(std::chrono::milliseconds(timeout_ms));
  timer_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
    if (ec || self->closed_ || generation != self->timer_generation_ || self->responding_) return;
    self->Close();  // header/body/idle timeout
  });
}

void Connection::CancelTimer() {
  ++timer_generation_;
  timer_.cancel();
}

void Connection::Close() {
  if (closed_) return;
  closed_ = true;
  CancelTimer();
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  next_.clear();
  if (auto writer = writer_.lock()) writer->OnDisconnect();
  writer_.reset();
  // NOTE: parser_ stays: a read still in flight (ReadHeader's, or the body's) holds a
  // reference to it and touches it when it completes with the close's error. It dies
  // with the connection, after that handler.
  server_->Unregister(id_);
}

// ---------------------------------------------------------------------------------
// Impl

absl::Status HttpServer::Impl::Start() {
  if (started_.exchange(true)) return absl::FailedPreconditionError("HttpServer already started");
  beast::error_code ec;
  const auto address = asio::ip::make_address(options_.address, ec);
  if (ec) return absl::InvalidArgumentError("bad listen address '" + options_.address + "': " + ec.message());
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(options_.listen_backlog, ec);
  if (ec) {
    acceptor_.close(ec);
    return absl::UnavailableError("cannot listen on " + options_.address + ":" + std::to_string(options_.port) +
                                  ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint(ec).port();
  running_.store(true);
  work_.emplace(asio::make_work_guard(ioc_));
  DoAccept();
  for (int32_t i = 0; i < options_.num_threads; ++i) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          ioc_.run();
          return;
        } catch (const std::exception& e) {  // NOTE: handlers should not throw; keep serving if one does
          KVMESH_LOG(kError) << "http io thread caught: " << e.what();
        }
      }
    });
  }
  return absl::OkStatus();
}

void HttpServer::Impl::DoAccept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
    self->OnAccept(ec, std::move(s));
  });
}

void HttpServer::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    // E.g. EMFILE: back off instead of spinning.
    KVMESH_LOG(kWarning) << "http accept failed: " << ec.message();
    accept_retry_timer_.expires_after(std::chrono::milliseconds(50));
    accept_retry_timer_.async_wait([self = shared_from_this()](beast::error_code wait_ec) {
      if (!wait_ec && self->acceptor_.is_open()) self->DoAccept();
    });
    return;
  }
  if (draining()) {
    socket.close(ec);
    return;
  }
  socket.set_option(tcp::no_delay(true), ec);
  if (num_connections_.load() >= options_.max_connections) {
    auto sock = std::make_shared<tcp::socket>(std::move(socket));
    auto bytes = std::make_shared<std::string>(SerializeError(503, "too many connections", false));
    asio::async_write(*sock, asio::buffer(*bytes), [sock, bytes](beast::error_code, size_t) {
      beast::error_code ignored;
      sock->shutdown(tcp::socket::shutdown_both, ignored);
      sock->close(ignored);
    });
  } else {
    uint64_t id;
    {
      std::lock_guard lock(mu_);
      id = next_id_++;
    }
    auto connection = std::make_shared<Connection>(shared_from_this(), std::move(socket), id);
    {
      std::lock_guard lock(mu_);
      connections_[id] = connection;
      num_connections_.fetch_add(1);
    }
    connection->Start();
  }
  DoAccept();
}

void HttpServer::Impl::Unregister(uint64_t id) {
  std::lock_guard lock(mu_);
  if (connections_.erase(id) > 0) num_connections_.fetch_sub(1);
  cv_.notify_all();
}

std::vector<std::shared_ptr<Connection>> HttpServer::Impl::Snapshot() {
  std::vector<std::shared_ptr<Connection>> out;
  std::lock_guard lock(mu_);
  for (auto& [id, weak] : connections_) {
    if (auto c = weak.lock()) out.push_back(std::move(c));
  }
  return out;
}

void HttpServer::Impl::Dispatch(HttpRequest request, const std::shared_ptr<ResponseWriter>& writer) {
  auto path_it = routes_.find(request.path);
  if (path_it == routes_.end()) {
    ApiError error;
    error.http_status = 404;
    error.type = std::string(ErrorTypeForHttpStatus(404));
    error.message = "no route for " + request.path;
    (void)writer->Send(ApiErrorResponse(error));
    return;
  }
  auto method_it = path_it->second.find(request.method);
  if (method_it == path_it->second.end()) {
    std::string allow;
    for (const auto& [method, handler] : path_it->second) allow += (allow.empty() ? "" : ", ") + method;
    ApiError error;
    error.http_status = 405;
    error.type = std::string(ErrorTypeForHttpStatus(405));
    error.message = "method " + request.method + " not allowed for " + request.path;
    HttpResponse response = ApiErrorResponse(error);
    response.headers.Add("Allow", allow);
    (void)writer->Send(std::move(response));
    return;
  }
  try {
    method_it->second(std::move(request), writer);
  } catch (const std::exception& e) {
    KVMESH_LOG(kError) << "http handler threw: " << e.what();
    ApiError error;
    error.http_status = 500;
    error.type = std::string(ErrorTypeForHttpStatus(500));
    error.message = "internal error";
    (void)writer->Send(ApiErrorResponse(error));
  }
}

void HttpServer::Impl::Shutdown(std::chrono::milliseconds grace) {
  if (!running_.load() || shut_down_.exchange(true)) return;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  draining_.store(true, std::memory_order_release);
  {
    std::promise<void> closed;
    asio::post(acceptor_.get_executor(), [this, &closed] {
      beast::error_code ec;
      acceptor_.close(ec);
      accept_retry_timer_.cancel();
      closed.set_value();
    });
    closed.get_future().wait();
  }
  for (auto& c : Snapshot()) c->BeginDrain();
  {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, deadline, [&] { return connections_.empty(); });
  }
  for (auto& c : Snapshot()) c->ForceClose();
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return connections_.empty(); });
  }
  // Let the aborted operations' handlers run (they hold the connections), then stop.
  stopped_.store(true, std::memory_order_release);
  work_.reset();
  std::atomic<bool> joined{false};
  std::thread watchdog([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!joined.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!joined.load()) ioc_.stop();  // something still pending: stop anyway
  });
  for (auto& t : threads_) t.join();
  joined.store(true);
  watchdog.join();
  threads_.clear();
}

// ---------------------------------------------------------------------------------
// HttpServer

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerOptions& options) {
  if (options.num_threads <= 0) return absl::InvalidArgumentError("num_threads must be > 0");
  if (options.max_body_bytes < 0) return absl::InvalidArgumentError("max_body_bytes must be >= 0");
  if (options.max_header_bytes <= 0) return absl::InvalidArgumentError("max_header_bytes must be > 0");
  if (options.header_timeout_ms <= 0 || options.read_timeout_ms <= 0 || options.idle_timeout_ms <= 0) {
    return absl::InvalidArgumentError("timeouts must be > 0");
  }
  if (options.max_connections <= 0) return absl::InvalidArgumentError("max_connections must be > 0");
  return std::unique_ptr<HttpServer>(new HttpServer(std::make_shared<Impl>(options)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { impl_->Shutdown(std::chrono::milliseconds(0)); }

void HttpServer::Handle(std::string_view method, std::string_view path, HttpHandler handler) {
  impl_->Handle(method, path, std::move(handler));
}

absl::Status HttpServer::Start() { return impl_->Start(); }
uint16_t HttpServer::port() const { return impl_->port(); }
int32_t HttpServer::num_connections() const { return impl_->num_connections(); }
void HttpServer::Shutdown(std::chrono::milliseconds grace) { impl_->Shutdown(grace); }

}  // namespace kvmesh::http
