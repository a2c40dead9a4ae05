// http_bench: libs/http HttpServer on loopback.
//   1. requests/s for a tiny JSON endpoint over keep-alive, N client connections;
//   2. SSE chunks/s: S concurrent streams fed by one producer thread (the "engine"),
//      with backpressure (the producer waits for NotifyWhenDrained past 1 MiB).
// Prints the median of several trials. Clients are blocking POSIX sockets, one
// thread each, on the same machine: on 2 cores they compete with the server.
//
//   http_bench [--threads 2] [--conns 1,4,16,64] [--streams 1,8,64] [--seconds 1] [--trials 5]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_server.h"

namespace {

using kvmesh::http::HttpRequest;
using kvmesh::http::HttpResponse;
using kvmesh::http::HttpServer;
using kvmesh::http::ResponseWriter;
using Clock = std::chrono::steady_clock;

int Connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads one Content-Length response; `buf` keeps bytes past it.
bool ReadResponse(int fd, std::string& buf) {
  char tmp[16384];
  for (;;) {
    const size_t head_end = buf.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      const size_t cl = buf.find("Content-Length: ");
      if (cl == std::string::npos || cl > head_end) return false;
      const size_t len = std::strtoull(buf.c_str() + cl + 16, nullptr, 10);
      if (buf.size() >= head_end + 4 + len) {
        buf.erase(0, head_end + 4 + len);
        return true;
      }
    }
    const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double RequestsPerSecond(uint16_t port, int conns, double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> total{0};
  std::vector<std::thread> threads;
  const std::string request = "GET /tiny HTTP/1.1\r\nHost: bench\r\n\r\n";
  for (int i = 0; i < conns; ++i) {
    threads.emplace_back([&] {
      const int fd = Connect(port);
      if (fd < 0) return;
      std::string buf;
      int64_t done = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (!SendAll(fd, request) || !ReadResponse(fd, buf)) break;
        ++done;
      }
      total.fetch_add(done);
      ::close(fd);
    });
  }
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(total.load()) / elapsed;
}

struct StreamBox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<ResponseWriter>> writers;
};

double ChunksPerSecond(uint16_t port, StreamBox* box, int streams, int chunks_per_stream) {
  {
    std::lock_guard lock(box->mu);
    box->writers.clear();
  }
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  std::atomic<int64_t> received_bytes{0};
  for (int i = 0; i < streams; ++i) {
    clients.emplace_back([&] {
      const int fd = Connect(port);
      if (fd < 0) return;
      SendAll(fd, "GET /sse HTTP/1.1\r\nHost: bench\r\n\r\n");
      std::string tail;
      char tmp[65536];
      int64_t bytes = 0;
      for (;;) {
        const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
        if (n <= 0) break;
        bytes += n;
        tail.append(tmp, static_cast<size_t>(n));
        if (tail.size() > 16) tail.erase(0, tail.size() - 16);
        if (tail.size() >= 5 && tail.compare(tail.size() - 5, 5, "0\r\n\r\n") == 0) break;
      }
      received_bytes.fetch_add(bytes);
      ::close(fd);
    });
  }
  std::vector<std::shared_ptr<ResponseWriter>> writers;
  {
    std::unique_lock lock(box->mu);
    box->cv.wait(lock, [&] { return static_cast<int>(box->writers.size()) == streams; });
    writers = box->writers;
  }
  // ~80-byte chunks, the size of an OpenAI chat.completion.chunk event.
  const std::string chunk =
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n";
  for (int k = 0; k < chunks_per_stream; ++k) {
    for (auto& w : writers) {
      if (w->buffered_bytes() > (1 << 20)) {  // backpressure
        std::mutex m;
        std::condition_variable cv;
        bool drained = false;
        w->NotifyWhenDrained([&] {
          std::lock_guard lock(m);
          drained = true;
          cv.notify_all();
        });
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return drained; });
      }
      w->Write(chunk);
    }
  }
  for (auto& w : writers) w->Finish();
  for (auto& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(streams) * chunks_per_stream / elapsed;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, trials = 5;
  double seconds = 1.0;
  std::vector<int> conns = {1, 4, 16, 64};
  std::vector<int> streams = {1, 8, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--conns") conns = ParseList(argv[i + 1]);
    else if (flag == "--streams") streams = ParseList(argv[i + 1]);
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--trials") trials = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  auto created = HttpServer::Create({.num_threads = threads});
  if (!created.ok()) return 1;
  auto server = std::move(created).value();
  StreamBox box;
  server->Handle("GET", "/tiny", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Json(200, R"({"ok":true})"));
  });
  server->Handle("GET", "/sse", [&box](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->StartStream();
    std::lock_guard lock(box.mu);
    box.writers.push_back(std::move(w));
    box.cv.notify_all();
  });
  if (!server->Start().ok()) return 1;
  std::printf("http_bench: server %d I/O threads, %u hardware threads, %d trials, median\n", threads,
              std::thread::hardware_concurrency(), trials);
  for (int c : conns) {
    std::vector<double> r;
    for (int t = 0; t < trials; ++t) r.push_back(RequestsPerSecond(server->port(), c, seconds));
    std::printf("  tiny JSON keep-alive  conns=%-4d %10.0f req/s\n", c, Median(r));
  }
  for (int s : streams) {
    const int per_stream = std::max(200, 200000 / s);
    std::vector<double> r;
    for (int t = 0; t < trials; ++t) r.push_back(ChunksPerSecond(server->port(), &box, s, per_stream));
    std::printf("  SSE chunks (~80 B)    streams=%-4d %10.0f chunks/s  (%d chunks per stream)\n", s, Median(r),
                per_stream);
  }
  server->Shutdown(std::chrono::seconds(5));
  return 0;
}
