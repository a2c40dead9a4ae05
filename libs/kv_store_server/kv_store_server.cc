#include "kv_store_server/kv_store_server.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "core/host_port.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "http/metrics_endpoint.h"

namespace kvmesh::kv_store {

absl::StatusOr<std::unique_ptr<KvStoreServer>> KvStoreServer::Start(const KvStoreServerOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(const HostPort listen, ParseHostPort(options.listen_address));
  std::unique_ptr<KvStoreServer> server(new KvStoreServer());
  KVMESH_ASSIGN_OR_RETURN(server->store_, BlockStore::Create(options.store));
  if (options.ucx_data_plane) {
    KvStoreUcxOptions ucx = options.ucx;
    ucx.hello_timeout_ms = options.store.intent_timeout_ms;
    KVMESH_ASSIGN_OR_RETURN(server->plane_, KvStoreUcxPlane::Create(*server->store_, ucx));
  }
  KVMESH_ASSIGN_OR_RETURN(server->metrics_, KvStoreMetrics::Create(server->registry_, *server->store_, absl::Now()));
  if (options.metrics_port >= 0) {
    KVMESH_RETURN_IF_ERROR(CheckPort(options.metrics_port, "metrics_port"));
    KVMESH_ASSIGN_OR_RETURN(server->metrics_http_, http::StartMetricsEndpoint(listen.host, options.metrics_port,
                                                                               server->registry_, "kv-store"));
  }
  server->service_ =
      std::make_unique<KvStoreService>(*server->store_, server->metrics_.get(), options.api_keys, server->plane_.get());
  KVMESH_ASSIGN_OR_RETURN(server->grpc_,
                          rpc::GrpcServer::Start({.address = options.listen_address},
                                                 {{server->service_.get(), v1::KvStore::service_full_name()}}));
  const BlockStore& store = *server->store_;
  KVMESH_LOG(kInfo) << "kv-store listening" << LogKv("address", server->grpc_->address())
                    << LogKv("port", server->grpc_->port()) << LogKv("epoch", absl::StrFormat("%016x", store.epoch()))
                    << LogKv("capacity_blocks", store.capacity_blocks()) << LogKv("slot_bytes", store.slot_bytes())
                    << LogKv("api_keys", options.api_keys.size())
                    << LogKv("data_plane", server->plane_ != nullptr ? "ucx" : "grpc");
  return server;
}

KvStoreServer::~KvStoreServer() { Shutdown(0); }

void KvStoreServer::Shutdown(int64_t grace_ms) {
  if (grpc_ != nullptr) grpc_->Shutdown(grace_ms);
  if (metrics_http_ != nullptr) metrics_http_->Shutdown(std::chrono::milliseconds(1000));
}

}  // namespace kvmesh::kv_store
