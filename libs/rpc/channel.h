// Client channels to kvmesh services with production defaults: keepalive pings (so a
// dead peer is noticed on an idle connection), bounded reconnect backoff and large
// message limits (KV chunks, long prompts).
//
//   auto channel = rpc::CreateChannel("10.0.0.7:50051");
//   auto stub = kvmesh::v1::Scheduler::NewStub(channel);
//   grpc::ClientContext context;
//   rpc::SetTimeout(&context, 2000);
//
// Thread-safety: pure functions; a grpc::Channel is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include <grpcpp/channel.h>  // callers pass the channel to generated NewStub()

#include "absl/status/status.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace kvmesh::rpc {

struct ChannelOptions {
  int32_t keepalive_time_ms = 30'000;  // >= the server's min_client_ping_interval_ms
  int32_t keepalive_timeout_ms = 10'000;
  bool keepalive_permit_without_calls = true;
  int32_t initial_reconnect_backoff_ms = 100;
  // How long one connection attempt may take to finish the HTTP/2 handshake (gRPC reads
  // it from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS). NOTE: 100 ms cut off handshakes with a
  // busy peer on a loaded 2-core machine ("connection attempt timed out before
  // receiving SETTINGS frame") and made a live worker look lost; a refused connection
  // (dead peer) fails at once regardless, and a stopped one is given up on after this.
  int32_t connect_timeout_ms = 1'000;
  int32_t max_reconnect_backoff_ms = 5'000;
  int32_t max_receive_message_bytes = 256 << 20;
  int32_t max_send_message_bytes = 256 << 20;
  // gRPC's transparent retries of calls that never left the client.
  bool enable_retries = true;
};

// A channel to `target` ("host:port", "dns:///name:port", "unix:/path"): plaintext, or
// mutual TLS once ConfigureTransportSecurity (transport_security.h) was given files.
// Creation never fails; connecting is lazy (see WaitForConnected).
std::shared_ptr<grpc::Channel> CreateChannel(std::string_view target, const ChannelOptions& options = {});

// Blocks until the channel is READY. DeadlineExceeded after `timeout_ms`.
absl::Status WaitForConnected(grpc::Channel& channel, int64_t timeout_ms);

// Sets `context`'s deadline to now + timeout_ms (RPC deadlines are how kvmesh bounds
// every call; a call without one can hang on a partitioned peer).
void SetTimeout(grpc::ClientContext* context, int64_t timeout_ms);

}  // namespace kvmesh::rpc
