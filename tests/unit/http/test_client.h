// A small blocking HTTP/1.1 client for tests: POSIX sockets with poll() timeouts
// (so a broken server fails a test instead of hanging it) and Beast's response parser.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace kvmesh::http::testing {

using Response = boost::beast::http::response<boost::beast::http::string_body>;

class TestClient {
 public:
  explicit TestClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TestClient() { Close(); }
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  static std::string RequestText(std::string_view method, std::string_view target, std::string_view body = "",
                                 std::vector<std::pair<std::string, std::string>> headers = {}) {
    std::string out = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: localhost\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST") out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    out += "\r\n";
    out += body;
    return out;
  }

  // One recv() of whatever is available within `timeout_ms`; false on timeout, EOF or error.
  bool Recv(int timeout_ms) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  // Receives until `needle` is in the buffer (searching from `from`).
  bool RecvUntil(std::string_view needle, int timeout_ms, size_t from = 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (buffer_.find(needle, from) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !Recv(static_cast<int>(left.count()))) return false;
    }
    return true;
  }

  // True when the server closes the connection within `timeout_ms` (data read meanwhile is kept).
  bool WaitForClose(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!eof_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      if (!Recv(static_cast<int>(left.count())) && !eof_) return false;
    }
    return true;
  }

  // Parses one response from the buffer, receiving more as needed.
  std::optional<Response> ReadResponse(int timeout_ms = 5000) {
    namespace bhttp = boost::beast::http;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.eager(true);
    parser.body_limit(1ull << 32);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (!buffer_.empty()) {
        boost::beast::error_code ec;
        const size_t n = parser.put(boost::asio::buffer(buffer_.data(), buffer_.size()), ec);
        buffer_.erase(0, n);
        if (ec && ec != bhttp::error::need_more) return std::nullopt;
        if (parser.is_done()) return parser.release();
        if (!ec && n > 0) continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      if (!Recv(static_cast<int>(left.count()))) {
        if (!eof_) return std::nullopt;
        boost::beast::error_code ec;
        parser.put_eof(ec);
        if (!ec && parser.is_done()) return parser.release();
        return std::nullopt;
      }
    }
  }

  std::optional<Response> Request(std::string_view method, std::string_view target, std::string_view body = "",
                                  std::vector<std::pair<std::string, std::string>> headers = {}) {
    if (!Send(RequestText(method, target, body, std::move(headers)))) return std::nullopt;
    return ReadResponse();
  }

  std::string& buffer() { return buffer_; }
  bool eof() const { return eof_; }

 private:
  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
};

}  // namespace kvmesh::http::testing
