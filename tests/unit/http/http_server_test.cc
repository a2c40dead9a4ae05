#include "http/http_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_client.h"

namespace kvmesh::http {
namespace {

using testing::Response;
using testing::TestClient;
using namespace std::chrono_literals;

std::unique_ptr<HttpServer> MakeServer(HttpServerOptions options = {}) {
  auto server = HttpServer::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

std::string Header(const Response& r, std::string_view name) {
  auto it = r.find(boost::beast::string_view(name.data(), name.size()));
  return it == r.end() ? std::string() : std::string(it->value().data(), it->value().size());
}

// Collects the writers handed to a streaming handler.
class WriterBox {
 public:
  void Put(std::shared_ptr<ResponseWriter> w) {
    std::lock_guard lock(mu_);
    writers_.push_back(std::move(w));
    cv_.notify_all();
  }
  // Waits until `n` writers have arrived.
  bool WaitFor(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return writers_.size() >= n; });
  }
  std::shared_ptr<ResponseWriter> at(size_t i) {
    std::lock_guard lock(mu_);
    return writers_.at(i);
  }
  std::vector<std::shared_ptr<ResponseWriter>> all() {
    std::lock_guard lock(mu_);
    return writers_;
  }
  void Clear() {
    std::lock_guard lock(mu_);
    writers_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<ResponseWriter>> writers_;
};

HttpHandler StreamHandler(WriterBox* box) {
  return [box](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    EXPECT_TRUE(w->StartStream().ok());
    box->Put(std::move(w));
  };
}

TEST(HttpServerTest, CreateRejectsBadOptions) {
  EXPECT_EQ(HttpServer::Create({.num_threads = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Create({.max_connections = 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HttpServerTest, StartFailsOnAPortInUse) {
  auto a = MakeServer();
  ASSERT_TRUE(a->Start().ok());
  auto b = MakeServer({.port = a->port()});
  EXPECT_EQ(b->Start().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a->Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HttpServerTest, RoutesByMethodAndPathWith404And405) {
  auto server = MakeServer();
  server->Handle("GET", "/health", [](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    HttpResponse r = HttpResponse::Json(200, R"({"status":"ok"})");
    r.headers.Add("X-Echo", std::string(req.headers.Get("x-test").value_or("none")));
    r.headers.Add("X-Query", req.QueryParam("verbose").value_or("absent"));
    r.headers.Add("X-Path", req.path);
    EXPECT_TRUE(w->Send(std::move(r)).ok());
    EXPECT_EQ(w->Send(HttpResponse::Json(200, "{}")).code(), absl::StatusCode::kFailedPrecondition);
  });
  server->Handle("POST", "/echo", [](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(201, req.method + ":" + req.body));
  });
  ASSERT_TRUE(server->Start().ok());
  ASSERT_NE(server->port(), 0);

  TestClient c(server->port());
  ASSERT_TRUE(c.connected());
  auto ok = c.Request("GET", "/health?verbose=1&x", "", {{"X-TEST", "hello"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->result_int(), 200);
  EXPECT_EQ(ok->body(), R"({"status":"ok"})");
  EXPECT_EQ(Header(*ok, "Content-Type"), "application/json");
  EXPECT_EQ(Header(*ok, "X-Echo"), "hello");  // case-insensitive lookup
  EXPECT_EQ(Header(*ok, "X-Query"), "1");
  EXPECT_EQ(Header(*ok, "X-Path"), "/health");

  auto echo = c.Request("POST", "/echo", "abc");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->result_int(), 201);
  EXPECT_EQ(echo->body(), "POST:abc");

  auto missing = c.Request("GET", "/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->result_int(), 404);
  EXPECT_NE(missing->body().find(R"("type":"not_found_error")"), std::string::npos) << missing->body();

  auto wrong = c.Request("DELETE", "/health");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->result_int(), 405);
  EXPECT_EQ(Header(*wrong, "Allow"), "GET");
  EXPECT_NE(wrong->body().find(R"({"error":{"message":)"), std::string::npos) << wrong->body();
}

TEST(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnectionAndPipelinesInOrder) {
  auto server = MakeServer();
  std::atomic<int> served{0};
  server->Handle("GET", "/n", [&](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    served.fetch_add(1);
    (void)w->Send(HttpResponse::Text(200, req.QueryParam("i").value_or("?")));
  });
  // A slow handler: answers from another thread later, so the pipelined requests behind
  // it must wait their turn.
  server->Handle("GET", "/slow", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    std::thread([w] {
      std::this_thread::sleep_for(50ms);
      (void)w->Send(HttpResponse::Text(200, "slow"));
    }).detach();
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  for (int i = 0; i < 5; ++i) {
    auto r = c.Request("GET", "/n?i=" + std::to_string(i));
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body(), std::to_string(i));
    EXPECT_TRUE(r->keep_alive());
  }
  EXPECT_EQ(server->num_connections(), 1);

  std::string pipelined = TestClient::RequestText("GET", "/slow");
  for (int i = 5; i < 8; ++i) pipelined += TestClient::RequestText("GET", "/n?i=" + std::to_string(i));
  ASSERT_TRUE(c.Send(pipelined));
  auto slow = c.ReadResponse();
  ASSERT_TRUE(slow);
  EXPECT_EQ(slow->body(), "slow");
  for (int i = 5; i < 8; ++i) {
    auto r = c.ReadResponse();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body(), std::to_string(i));
  }
  EXPECT_EQ(served.load(), 8);
}

TEST(HttpServerTest, ConnectionCloseRequestIsHonoured) {
  auto server = MakeServer();
  server->Handle("GET", "/x", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(200, "x"));
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  auto r = c.Request("GET", "/x", "", {{"Connection", "close"}});
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->keep_alive());
  EXPECT_TRUE(c.WaitForClose(2000));
}

TEST(HttpServerTest, OversizedBodyGets413WithJsonError) {
  auto server = MakeServer({.max_body_bytes = 1024});
  std::atomic<int> called{0};
  server->Handle("POST", "/v1/completions", [&](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    called.fetch_add(1);
    (void)w->Send(HttpResponse::Text(200, std::to_string(req.body.size())));
  });
  ASSERT_TRUE(server->Start().ok());
  {
    TestClient c(server->port());
    auto ok = c.Request("POST", "/v1/completions", std::string(1024, 'a'));
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->body(), "1024");
  }
  {  // Content-Length over the limit: refused before the body is read.
    TestClient c(server->port());
    auto r = c.Request("POST", "/v1/completions", std::string(64 << 10, 'a'));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->result_int(), 413);
    EXPECT_NE(r->body().find(R"("type":"invalid_request_error")"), std::string::npos) << r->body();
    EXPECT_FALSE(r->keep_alive());
  }
  {  // Chunked body growing over the limit.
    TestClient c(server->port());
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 4; ++i) req += "200\r\n" + std::string(512, 'b') + "\r\n";
    req += "0\r\n\r\n";
    ASSERT_TRUE(c.Send(req));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->result_int(), 413);
  }
  EXPECT_EQ(called.load(), 1);
}

TEST(HttpServerTest, ExpectContinueGets100BeforeTheBody) {
  auto server = MakeServer();
  server->Handle("POST", "/p", [](HttpRequest req, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(200, req.body));
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send("POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  ASSERT_TRUE(c.RecvUntil("HTTP/1.1 100 Continue\r\n\r\n", 2000));
  c.buffer().erase(0, c.buffer().find("\r\n\r\n") + 4);
  ASSERT_TRUE(c.Send("hello"));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body(), "hello");
}

TEST(HttpServerTest, MalformedRequestGets400) {
  auto server = MakeServer();
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send("THIS IS NOT HTTP\r\n\r\n"));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 400);
  EXPECT_TRUE(c.WaitForClose(2000));
}

TEST(HttpServerTest, HandlerThatThrowsOrDropsItsWriterGets500) {
  auto server = MakeServer();
  server->Handle("GET", "/throw", [](HttpRequest, std::shared_ptr<ResponseWriter>) {
    throw std::runtime_error("boom");
  });
  server->Handle("GET", "/drop", [](HttpRequest, std::shared_ptr<ResponseWriter>) {});
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  auto a = c.Request("GET", "/throw");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->result_int(), 500);
  auto b = c.Request("GET", "/drop");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->result_int(), 500);
  EXPECT_NE(b->body().find(R"("type":"server_error")"), std::string::npos);
}

TEST(HttpServerTest, SseChunksWrittenFromAnotherThreadArriveIncrementally) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("POST", "/v1/completions", StreamHandler(&box));
  server->Handle("GET", "/after", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(200, "after"));
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send(TestClient::RequestText("POST", "/v1/completions", "{}")));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  ASSERT_TRUE(c.RecvUntil("\r\n\r\n", 2000));
  EXPECT_NE(c.buffer().find("Content-Type: text/event-stream"), std::string::npos) << c.buffer();
  EXPECT_NE(c.buffer().find("Transfer-Encoding: chunked"), std::string::npos);

  std::promise<bool> completed;
  auto writer = box.at(0);
  writer->SetOnComplete([&](bool delivered) { completed.set_value(delivered); });
  // The producer is another thread; each chunk must reach the client before the next
  // is produced (nothing waits for Finish()).
  std::mutex mu;
  std::condition_variable cv;
  int acked = -1;
  std::thread producer([&] {
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(writer->Write("data: token-" + std::to_string(i) + "\n\n"));
      std::unique_lock lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return acked == i; }));
    }
    writer->Finish();
    EXPECT_FALSE(writer->Write("late"));
  });
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.RecvUntil("data: token-" + std::to_string(i) + "\n\n", 5000)) << i;
    std::lock_guard lock(mu);
    acked = i;
    cv.notify_all();
  }
  producer.join();
  auto r = c.ReadResponse();  // parses the whole chunked response from what was received
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body(), "data: token-0\n\ndata: token-1\n\ndata: token-2\n\ndata: token-3\n\ndata: token-4\n\n");
  EXPECT_TRUE(completed.get_future().get());
  // The connection is still usable after the stream.
  auto after = c.Request("GET", "/after");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->body(), "after");
}

TEST(HttpServerTest, ClientDisconnectMidStreamFiresOnDisconnect) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("POST", "/v1/chat/completions", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send(TestClient::RequestText("POST", "/v1/chat/completions", "{}")));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  auto writer = box.at(0);
  std::promise<void> disconnected;
  std::promise<bool> completed;
  writer->SetOnDisconnect([&] { disconnected.set_value(); });
  writer->SetOnComplete([&](bool delivered) { completed.set_value(delivered); });
  ASSERT_TRUE(writer->Write("data: first\n\n"));
  ASSERT_TRUE(c.RecvUntil("data: first", 5000));
  c.Close();
  ASSERT_EQ(disconnected.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(completed.get_future().get());
  EXPECT_TRUE(writer->disconnected());
  EXPECT_FALSE(writer->Write("data: second\n\n"));  // a no-op now
  writer->Finish();
  bool late_called = false;
  writer->SetOnDisconnect([&] { late_called = true; });  // already gone: runs at once
  EXPECT_TRUE(late_called);
  // The server dropped the connection.
  for (int i = 0; i < 100 && server->num_connections() != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->num_connections(), 0);
}

TEST(HttpServerTest, BackpressureBuffersForASlowReaderAndSignalsDrained) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("GET", "/big", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send(TestClient::RequestText("GET", "/big")));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  auto writer = box.at(0);
  const std::string chunk(1 << 20, 'z');
  constexpr int kChunks = 48;  // far beyond what loopback socket buffers absorb
  for (int i = 0; i < kChunks; ++i) ASSERT_TRUE(writer->Write(chunk));
  writer->Finish();
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(writer->buffered_bytes(), 0);  // the client has not read anything
  std::promise<void> drained;
  auto drained_future = drained.get_future();
  writer->NotifyWhenDrained([&] { drained.set_value(); });
  size_t total = 0;
  const size_t expected = static_cast<size_t>(kChunks) * chunk.size();
  while (total < expected && c.Recv(5000)) {
    total += c.buffer().size();
    c.buffer().clear();
  }
  EXPECT_EQ(drained_future.wait_for(5s), std::future_status::ready);
  EXPECT_GE(total, static_cast<size_t>(kChunks) * chunk.size());
  EXPECT_EQ(writer->buffered_bytes(), 0);
  EXPECT_GT(total, 0u);
}

TEST(HttpServerTest, GracefulShutdownFinishesAnInFlightStream) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("POST", "/v1/completions", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  const uint16_t port = server->port();
  TestClient idle(port);  // an idle keep-alive connection: closed at once by the drain
  TestClient c(port);
  ASSERT_TRUE(c.Send(TestClient::RequestText("POST", "/v1/completions", "{}")));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  auto writer = box.at(0);
  std::atomic<bool> disconnected{false};
  std::promise<bool> completed;
  writer->SetOnDisconnect([&] { disconnected = true; });
  writer->SetOnComplete([&](bool delivered) { completed.set_value(delivered); });
  ASSERT_TRUE(writer->Write("data: 1\n\n"));
  ASSERT_TRUE(c.RecvUntil("data: 1", 5000));

  const auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] { server->Shutdown(10s); });
  EXPECT_TRUE(idle.WaitForClose(3000));
  std::this_thread::sleep_for(100ms);
  TestClient late(port);  // no longer accepted
  if (late.connected()) {
    EXPECT_TRUE(late.WaitForClose(3000));
  }

  ASSERT_TRUE(writer->Write("data: 2\n\n"));
  ASSERT_TRUE(writer->Write("data: [DONE]\n\n"));
  writer->Finish();
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(completed.get_future().get());
  EXPECT_FALSE(disconnected.load());
  auto r = c.ReadResponse();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body(), "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
  EXPECT_TRUE(c.WaitForClose(2000));
}

TEST(HttpServerTest, ShutdownDeadlineClosesAnUnfinishedStream) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("GET", "/forever", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send(TestClient::RequestText("GET", "/forever")));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  std::promise<void> disconnected;
  box.at(0)->SetOnDisconnect([&] { disconnected.set_value(); });
  const auto start = std::chrono::steady_clock::now();
  server->Shutdown(200ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(disconnected.get_future().wait_for(1s), std::future_status::ready);
  EXPECT_TRUE(c.WaitForClose(2000));
  EXPECT_FALSE(box.at(0)->Write("x"));  // the writer outlives the server safely
  server.reset();
  EXPECT_FALSE(box.at(0)->Write("y"));
}

TEST(HttpServerTest, IdleAndHeaderTimeoutsCloseTheConnection) {
  auto server = MakeServer({.header_timeout_ms = 200, .idle_timeout_ms = 200});
  server->Handle("GET", "/x", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(200, "x"));
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient a(server->port());
  ASSERT_TRUE(a.Request("GET", "/x"));
  EXPECT_TRUE(a.WaitForClose(3000));  // idle keep-alive
  TestClient b(server->port());
  ASSERT_TRUE(b.Send("GET /x HTTP/1.1\r\nHost:"));  // a header that never ends
  EXPECT_TRUE(b.WaitForClose(3000));
}

TEST(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  auto server = MakeServer({.max_connections = 2});
  server->Handle("GET", "/x", [](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    (void)w->Send(HttpResponse::Text(200, "x"));
  });
  ASSERT_TRUE(server->Start().ok());
  TestClient a(server->port()), b(server->port());
  ASSERT_TRUE(a.Request("GET", "/x"));
  ASSERT_TRUE(b.Request("GET", "/x"));
  TestClient c(server->port());
  auto r = c.Request("GET", "/x");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 503);
}

TEST(HttpServerTest, Http10StreamIsRawAndEndsWithTheConnection) {
  auto server = MakeServer();
  WriterBox box;
  server->Handle("GET", "/s", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  ASSERT_TRUE(c.Send("GET /s HTTP/1.0\r\n\r\n"));
  ASSERT_TRUE(box.WaitFor(1, 5s));
  auto writer = box.at(0);
  ASSERT_TRUE(writer->Write("data: a\n\n"));
  writer->Finish();
  ASSERT_TRUE(c.WaitForClose(3000));
  EXPECT_EQ(c.buffer().find("Transfer-Encoding"), std::string::npos) << c.buffer();
  EXPECT_NE(c.buffer().find("Connection: close\r\n\r\ndata: a\n\n"), std::string::npos) << c.buffer();
}

TEST(HttpServerTest, OversizedHeaderGets431) {
  auto server = MakeServer({.max_header_bytes = 1024});
  ASSERT_TRUE(server->Start().ok());
  TestClient c(server->port());
  auto r = c.Request("GET", "/x", "", {{"X-Big", std::string(4096, 'h')}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 431);
}

TEST(HttpServerTest, TwoHundredConcurrentStreams) {
  constexpr int kClients = 200;
  constexpr int kChunks = 20;
  auto server = MakeServer({.num_threads = 2});
  WriterBox box;
  server->Handle("POST", "/v1/completions", StreamHandler(&box));
  ASSERT_TRUE(server->Start().ok());
  const auto start = std::chrono::steady_clock::now();

  std::atomic<int> ok_clients{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      TestClient c(server->port());
      if (!c.connected() || !c.Send(TestClient::RequestText("POST", "/v1/completions", "{\"i\":" + std::to_string(i) + "}"))) {
        return;
      }
      auto r = c.ReadResponse(20000);
      if (!r || r->result_int() != 200) return;
      std::string expected;
      for (int k = 0; k < kChunks; ++k) expected += "data: " + std::to_string(k) + "\n\n";
      if (r->body() == expected) ok_clients.fetch_add(1);
    });
  }
  ASSERT_TRUE(box.WaitFor(kClients, 20s));
  EXPECT_EQ(server->num_connections(), kClients);
  // One producer thread (the "engine") feeds every stream, a chunk per step.
  auto writers = box.all();
  for (int k = 0; k < kChunks; ++k) {
    for (auto& w : writers) EXPECT_TRUE(w->Write("data: " + std::to_string(k) + "\n\n"));
    std::this_thread::sleep_for(1ms);
  }
  for (auto& w : writers) w->Finish();
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok_clients.load(), kClients);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace kvmesh::http
