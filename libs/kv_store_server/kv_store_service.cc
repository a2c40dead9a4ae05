#include "kv_store_server/kv_store_service.h"

#include <utility>

#include "kv_store_server/kv_store_requests.h"
#include "rpc/api_key_auth.h"
#include "rpc/status_conversion.h"

namespace kvmesh::kv_store {
namespace {

// A Put stream: each message's block committed as it arrives; the first refused one
// ends the call with its status. Deletes itself in OnDone.
class PutReactor final : public grpc::ServerReadReactor<v1::KvPutBlock> {
 public:
  PutReactor(BlockStore& store, KvStoreMetrics* metrics, v1::KvPutResponse* response, const absl::Status& auth)
      : store_(store), metrics_(metrics), response_(response) {
    if (!auth.ok()) {
      End(auth);
      return;
    }
    StartRead(&block_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed the stream (or left: then the status goes nowhere)
      response_->set_epoch(store_.epoch());
      response_->set_num_committed(num_committed_);
      End(absl::OkStatus());
      return;
    }
    if (const absl::Status s = HandlePutBlock(store_, block_); !s.ok()) {
      End(s);
      return;
    }
    ++num_committed_;
    StartRead(&block_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->CountRequest("Put", status.code());
    Finish(rpc::ToGrpcStatus(status));
  }

  BlockStore& store_;
  KvStoreMetrics* const metrics_;
  v1::KvPutResponse* const response_;
  v1::KvPutBlock block_;
  int32_t num_committed_ = 0;
};

// A Get stream: the requested blocks in order, one write in flight; a block that is not
// committed ends it with NotFound. Every path ends in End(), exactly once: from the
// constructor or from OnWriteDone. Deletes itself in OnDone.
class GetReactor final : public grpc::ServerWriteReactor<v1::KvGetBlock> {
 public:
  GetReactor(BlockStore& store, KvStoreMetrics* metrics, const v1::KvGetRequest* request, const absl::Status& auth)
      : store_(store), metrics_(metrics), request_(request) {
    absl::Status s = auth;
    if (s.ok()) s = CheckGetRequest(store_, *request_);
    if (!s.ok()) {
      End(s);
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the reader went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ == request_->keys_size()) {
      End(absl::OkStatus());
      return;
    }
    block_.Clear();
    if (const absl::Status s = ReadGetBlock(store_, request_->keys(next_), &block_); !s.ok()) {
      End(s);
      return;
    }
    ++next_;
    StartWrite(&block_);
  }

  void End(const absl::Status& status) {
    EndGet(store_, *request_);
    if (metrics_ != nullptr) metrics_->CountRequest("Get", status.code());
    Finish(rpc::ToGrpcStatus(status));
  }

  BlockStore& store_;
  KvStoreMetrics* const metrics_;
  const v1::KvGetRequest* const request_;  // gRPC's, valid until OnDone
  v1::KvGetBlock block_;
  int next_ = 0;
};

}  // namespace

KvStoreService::KvStoreService(BlockStore& store, KvStoreMetrics* metrics, std::vector<std::string> api_keys)
    : store_(store), metrics_(metrics), api_keys_(std::move(api_keys)), started_(absl::Now()) {}

absl::Status KvStoreService::Authenticate(const grpc::CallbackServerContext& context) const {
  return rpc::AuthenticateApiKey(context, api_keys_).status();
}

grpc::ServerUnaryReactor* KvStoreService::Finish(grpc::CallbackServerContext* context, const char* method,
                                                 const absl::Status& status) {
  if (metrics_ != nullptr) metrics_->CountRequest(method, status.code());
  return rpc::FinishUnary(context, status);
}

grpc::ServerUnaryReactor* KvStoreService::Lookup(grpc::CallbackServerContext* context,
                                                 const v1::KvLookupRequest* request, v1::KvLookupResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = HandleLookup(store_, *request, response);
  return Finish(context, "Lookup", s);
}

grpc::ServerUnaryReactor* KvStoreService::PutIntent(grpc::CallbackServerContext* context,
                                                    const v1::KvPutIntentRequest* request,
                                                    v1::KvPutIntentResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = HandlePutIntent(store_, *request, response);
  return Finish(context, "PutIntent", s);
}

grpc::ServerReadReactor<v1::KvPutBlock>* KvStoreService::Put(grpc::CallbackServerContext* context,
                                                             v1::KvPutResponse* response) {
  return new PutReactor(store_, metrics_, response, Authenticate(*context));
}

grpc::ServerWriteReactor<v1::KvGetBlock>* KvStoreService::Get(grpc::CallbackServerContext* context,
                                                              const v1::KvGetRequest* request) {
  return new GetReactor(store_, metrics_, request, Authenticate(*context));
}

grpc::ServerUnaryReactor* KvStoreService::Release(grpc::CallbackServerContext* context,
                                                  const v1::KvReleaseRequest* request,
                                                  v1::KvReleaseResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = HandleRelease(store_, *request, response);
  return Finish(context, "Release", s);
}

grpc::ServerUnaryReactor* KvStoreService::Stats(grpc::CallbackServerContext* context,
                                                const v1::KvStoreStatsRequest* /*request*/,
                                                v1::KvStoreStatsResponse* response) {
  const absl::Status s = Authenticate(*context);
  if (s.ok()) FillStats(store_, absl::Now() - started_, response);
  return Finish(context, "Stats", s);
}

grpc::ServerUnaryReactor* KvStoreService::Events(grpc::CallbackServerContext* context,
                                                 const v1::KvStoreEventsRequest* request,
                                                 v1::KvStoreEventsResponse* response) {
  absl::Status s = Authenticate(*context);
  if (s.ok()) s = HandleEvents(store_, *request, response);
  return Finish(context, "Events", s);
}

}  // namespace kvmesh::kv_store
