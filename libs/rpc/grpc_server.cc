#include "rpc/grpc_server.h"

#include <chrono>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/host_port.h"
#include "core/logging.h"

namespace kvmesh::rpc {

std::string ReplacePort(std::string_view address, int port) {
  const size_t colon = address.rfind(':');
  // "[::1]:0" and "host:0" have a port after the last ':'; a bare IPv6 literal
  // ("::1") does not end in "]:port" and is left alone.
  if (colon == std::string_view::npos) return std::string(address);
  if (address.find(':') != colon && (colon == 0 || address[colon - 1] != ']')) return std::string(address);
  return std::string(address.substr(0, colon + 1)) + std::to_string(port);
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options,
                                                              std::span<const GrpcServiceEntry> services) {
  if (options.address.empty()) return absl::InvalidArgumentError("GrpcServer: empty listen address");
  if (services.empty()) return absl::InvalidArgumentError("GrpcServer: no services to serve");
  // gRPC would narrow a port beyond 65535 to 16 bits and listen elsewhere ("host:99999"
  // on 34463); unix sockets have no port.
  if (options.address.rfind("unix:", 0) != 0) {
    if (absl::StatusOr<HostPort> parsed = ParseHostPort(options.address); !parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("GrpcServer: ", parsed.status().message()));
    }
  }

  // Both are process-wide settings read when a ServerBuilder is created.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GrpcServer> server(new GrpcServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, ServerCredentials(options.peers), &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  // NOTE: gRPC binds with SO_REUSEPORT by default, so a second server on a taken port
  // would start and silently share it. A taken port must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options.min_client_ping_interval_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  for (const GrpcServiceEntry& entry : services) {
    if (entry.service == nullptr) return absl::InvalidArgumentError("GrpcServer: null service");
    builder.RegisterService(entry.service);
    if (!entry.full_name.empty()) server->service_names_.emplace_back(entry.full_name);
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("GrpcServer: cannot listen on ", options.address));
  }
  server->bound_address_ = ReplacePort(options.address, server->port_);
  server->SetServing(true);
  return server;
}

GrpcServer::~GrpcServer() { Shutdown(0); }

void GrpcServer::SetServing(bool serving) {
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  // The overall ("") status and every service that has been given one.
  health->SetServingStatus(serving);
  for (const std::string& name : service_names_) health->SetServingStatus(name, serving);
}

void GrpcServer::Shutdown(int64_t deadline_ms) {
  std::call_once(shutdown_once_, [&] {
    if (server_ == nullptr) return;
    SetServing(false);
    const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms);
    server_->Shutdown(deadline);
    KVMESH_LOG(kInfo) << "grpc server stopped" << LogKv("address", bound_address_);
  });
}

void GrpcServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace kvmesh::rpc
