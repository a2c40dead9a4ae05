// GrpcServer runs gRPC services (callback API) on one address, with the standard
// health service (grpc.health.v1.Health) and server reflection
// (grpc.reflection.v1alpha.ServerReflection) always on, so probes, grpcurl and
// grpc_health_probe work against every kvmesh service.
//
//   auto server = rpc::GrpcServer::Start(
//       {.address = "0.0.0.0:0"}, {{&service, kvmesh::v1::Scheduler::service_full_name()}});
//   KVMESH_LOG(kInfo) << "listening" << LogKv("port", (*server)->port());
//   ... (*server)->Shutdown(/*deadline_ms=*/5000);
//
// Health: "" (the whole server) and every registered service's full name report
// SERVING from Start() until Shutdown() begins (or SetServing(false) for a drain).
//
// Thread-safety: thread-safe. The services passed to Start() must outlive the server.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/transport_security.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace kvmesh::rpc {

// A service to serve and its full name (the generated `Foo::service_full_name()`; gRPC
// offers no way to read it back from a grpc::Service), for its health status.
struct GrpcServiceEntry {
  grpc::Service* service = nullptr;
  std::string_view full_name;
};

struct GrpcServerOptions {
  // host:port; port 0 picks a free port (see GrpcServer::port()).
  std::string address = "0.0.0.0:0";
  // Who calls: other kvmesh services (mutual TLS once transport security is
  // configured, transport_security.h) or end clients (server-side TLS only).
  PeerAuth peers = PeerAuth::kServices;
  int32_t max_receive_message_bytes = 256 << 20;  // KV chunks and long prompts
  int32_t max_send_message_bytes = 256 << 20;
  // Server-side keepalive pings, to notice dead peers on idle connections.
  int32_t keepalive_time_ms = 30'000;
  int32_t keepalive_timeout_ms = 10'000;
  // The most frequent client keepalive ping the server tolerates (must not exceed the
  // clients' ChannelOptions::keepalive_time_ms, or they get GOAWAY too_many_pings).
  int32_t min_client_ping_interval_ms = 10'000;
};

class GrpcServer {
 public:
  // Builds and starts the server. InvalidArgument for an empty address or no services;
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           std::span<const GrpcServiceEntry> services);
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           std::initializer_list<GrpcServiceEntry> services) {
    return Start(options, std::span<const GrpcServiceEntry>(services.begin(), services.size()));
  }

  // Shuts down (with a zero deadline: pending calls are cancelled).
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The bound port (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // The address as given, with the bound port.
  const std::string& address() const { return bound_address_; }
  // The full names of the registered services (e.g. "kvmesh.v1.Scheduler").
  const std::vector<std::string>& service_names() const { return service_names_; }

  // Health status of the server and every registered service (drain: false).
  void SetServing(bool serving);

  // Stops accepting calls, reports NOT_SERVING, waits up to `deadline_ms` for running
  // calls to finish and then cancels the rest. Idempotent; later calls return at once.
  void Shutdown(int64_t deadline_ms);

  // Blocks until Shutdown() has completed.
  void Wait();

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string bound_address_;
  std::vector<std::string> service_names_;
  std::once_flag shutdown_once_;
};

// `host:port` with the port replaced (for "0.0.0.0:0" -> "0.0.0.0:43512"); `address`
// unchanged if it has no port.
std::string ReplacePort(std::string_view address, int port);

}  // namespace kvmesh::rpc
