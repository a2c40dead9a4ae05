// KvStoreService: kvmesh.v1.KvStore (proto/kvmesh/v1/kv_store.proto) over a BlockStore,
// on gRPC's callback API. Each method checks the call's API key (when the store has
// --api_keys; mutual TLS is the GrpcServer's), then runs its request through
// kv_store_requests.h; Put is a read reactor (one block per message, each committed as
// it arrives), Get a write reactor (one block per message, one write in flight).
// With a UCX data plane (kv_store_data_plane.h) PutIntent may grant a lease, Put
// commits blocks written in place, and a Get with a lease descriptor has its blocks
// pushed first and then streams their checksums; only after Authenticate, so a UCX
// memory key never reaches a caller the control plane refused.
//
// Thread-safety: thread-safe; gRPC runs the methods and reactor callbacks on its
// threads. `store` and `metrics` must outlive the server that serves this.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "kv_store/block_store.h"
#include "kv_store_server/kv_store_data_plane.h"
#include "kv_store_server/kv_store_metrics.h"
#include "kvmesh/v1/kv_store.grpc.pb.h"

namespace kvmesh::kv_store {

class KvStoreService final : public v1::KvStore::CallbackService {
 public:
  // `metrics` and `plane` may be null (tests; a store without the UCX data plane).
  KvStoreService(BlockStore& store, KvStoreMetrics* metrics, std::vector<std::string> api_keys,
                 KvStoreUcxPlane* plane = nullptr);

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context, const v1::KvLookupRequest* request,
                                   v1::KvLookupResponse* response) override;
  grpc::ServerUnaryReactor* PutIntent(grpc::CallbackServerContext* context, const v1::KvPutIntentRequest* request,
                                      v1::KvPutIntentResponse* response) override;
  grpc::ServerReadReactor<v1::KvPutBlock>* Put(grpc::CallbackServerContext* context,
                                               v1::KvPutResponse* response) override;
  grpc::ServerWriteReactor<v1::KvGetBlock>* Get(grpc::CallbackServerContext* context,
                                                const v1::KvGetRequest* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context, const v1::KvReleaseRequest* request,
                                    v1::KvReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::KvStoreStatsRequest* request,
                                  v1::KvStoreStatsResponse* response) override;
  grpc::ServerUnaryReactor* Events(grpc::CallbackServerContext* context, const v1::KvStoreEventsRequest* request,
                                   v1::KvStoreEventsResponse* response) override;

 private:
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;
  // Counts the call and finishes it.
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const char* method,
                                   const absl::Status& status);

  BlockStore& store_;
  KvStoreMetrics* const metrics_;
  KvStoreUcxPlane* const plane_;
  const std::vector<std::string> api_keys_;
  const absl::Time started_;
};

}  // namespace kvmesh::kv_store
