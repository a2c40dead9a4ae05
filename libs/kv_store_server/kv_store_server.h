// KvStoreServer: the kv-store process (kvmesh-kv-store, `kvmesh kv-store`) assembled
// from its options: the BlockStore, its metrics and /metrics endpoint, and the
// kvmesh.v1.KvStore gRPC service (with health and reflection, mutual TLS when
// configured: rpc::GrpcServer), and with options.ucx_data_plane the UCX data plane
// (kv_store_data_plane.h) over the store's slot memory.
//
//   auto server = KvStoreServer::Start(options);       // serving when it returns
//   ... WaitForStopSignal() ...
//   (*server)->Shutdown(options.shutdown_grace_ms);    // NOT_SERVING, drain, stop
//
// The store's memory lives only as long as the process: a restart comes back empty with
// a new epoch, which is how clients know to forget what it held.
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "http/http_server.h"
#include "kv_store/block_store.h"
#include "kv_store_server/kv_store_data_plane.h"
#include "kv_store_server/kv_store_metrics.h"
#include "kv_store_server/kv_store_service.h"
#include "metrics/registry.h"
#include "rpc/grpc_server.h"

namespace kvmesh::kv_store {

struct KvStoreServerOptions {
  std::string listen_address = "0.0.0.0:50070";  // gRPC; port 0 picks a free one
  BlockStoreOptions store;
  std::vector<std::string> api_keys;  // empty: no API key asked
  int32_t metrics_port = 0;           // HTTP /metrics on the listen host; 0: a free one, -1: off
  int64_t shutdown_grace_ms = 5'000;  // on SIGTERM, how long running calls may take
  // Block bytes over UCX (one-sided, into and out of registered pools) for clients
  // that ask; the gRPC stream stays for the rest. A store whose UCX cannot start fails
  // to start (Internal): asked for, it is not silently dropped.
  bool ucx_data_plane = false;
  KvStoreUcxOptions ucx;
};

class KvStoreServer {
 public:
  // The errors of BlockStore::Create (InvalidArgument, ResourceExhausted), an invalid
  // listen address (InvalidArgument), or a port that cannot be bound (Unavailable).
  static absl::StatusOr<std::unique_ptr<KvStoreServer>> Start(const KvStoreServerOptions& options);
  ~KvStoreServer();
  KvStoreServer(const KvStoreServer&) = delete;
  KvStoreServer& operator=(const KvStoreServer&) = delete;

  int port() const { return grpc_->port(); }
  const std::string& address() const { return grpc_->address(); }
  // -1 when off.
  int metrics_port() const { return metrics_http_ != nullptr ? metrics_http_->port() : -1; }
  BlockStore& store() { return *store_; }
  // Null without options.ucx_data_plane.
  const KvStoreUcxPlane* plane() const { return plane_.get(); }

  // Health NOT_SERVING, running calls get `grace_ms` to finish, then the rest are
  // cancelled and the servers stop. Idempotent.
  void Shutdown(int64_t grace_ms);

 private:
  KvStoreServer() = default;

  // Destroyed bottom-up: the servers stop before what they read from.
  metrics::Registry registry_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<KvStoreUcxPlane> plane_;  // null without the data plane
  std::unique_ptr<KvStoreMetrics> metrics_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<http::HttpServer> metrics_http_;
  std::unique_ptr<rpc::GrpcServer> grpc_;
};

}  // namespace kvmesh::kv_store
