#include "kv_store_server/kv_store_service.h"

#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/logging.h"
#include "kv_store/kv_store_wire.h"

#include "kv_store_server/kv_store_requests.h"
#include "rpc/api_key_auth.h"
#include "rpc/status_conversion.h"

namespace kvmesh::kv_store {
namespace {

// A Put stream: each message's block committed as it arrives; the first refused one
// ends the call with its status. Deletes itself in OnDone.
class PutReactor final : public grpc::ServerReadReactor<v1::KvPutBlock> {
 public:
  PutReactor(BlockStore& store, KvStoreMetrics* metrics, v1::KvPutResponse* response, const absl::Status& auth,
             absl::Duration in_place_wait)
      : store_(store), metrics_(metrics), response_(response), in_place_wait_(in_place_wait) {
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
    // NOTE: an in_place block may wait (in_place_wait, normally not at all) on this gRPC
    // thread for the data plane to return its slot: the writer sends it only after its
    // push was acknowledged, which the store does after returning the slots.
    if (const absl::Status s = HandlePutBlock(store_, block_, in_place_wait_); !s.ok()) {
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
  const absl::Duration in_place_wait_;
  v1::KvPutBlock block_;
  int32_t num_committed_ = 0;
};

// A Get stream: the requested blocks in order, one write in flight; a block that is not
// committed ends it with NotFound. With a ucx_lease_descriptor the blocks are pushed
// over the data plane first, and the stream carries their checksums (in_place). Every
// path ends in End(), exactly once: from the constructor, OnPushed or OnWriteDone.
// Deletes itself in OnDone.
class GetReactor final : public grpc::ServerWriteReactor<v1::KvGetBlock> {
 public:
  GetReactor(BlockStore& store, KvStoreMetrics* metrics, KvStoreUcxPlane* plane, const v1::KvGetRequest* request,
             const absl::Status& auth)
      : store_(store), metrics_(metrics), request_(request) {
    absl::Status s = auth;
    if (s.ok()) s = CheckGetRequest(store_, *request_);
    if (s.ok() && !request_->ucx_lease_descriptor().empty() && plane == nullptr) {
      s = absl::FailedPreconditionError("ucx_lease_descriptor: this kv-store has no UCX data plane");
    }
    if (!s.ok()) {
      End(s);
      return;
    }
    if (request_->ucx_lease_descriptor().empty()) {
      WriteNext();
      return;
    }
    std::vector<StoreKey> keys;
    keys.reserve(static_cast<size_t>(request_->keys_size()));
    for (const v1::KvStoreKey& key : request_->keys()) keys.push_back(FromProto(key));
    plane->PushGet(std::move(keys), request_->ucx_lease_descriptor(),
                   [this](absl::Status status, std::vector<uint64_t> checksums) {
                     OnPushed(std::move(status), std::move(checksums));
                   });
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
  // The data plane's answer (its thread): the pushed blocks' checksums, streamed next.
  void OnPushed(absl::Status status, std::vector<uint64_t> checksums) {
    in_place_ = true;
    pushed_ = std::move(checksums);
    push_status_ = std::move(status);
    WriteNext();
  }

  void WriteNext() {
    block_.Clear();
    if (in_place_) {
      if (next_ == static_cast<int>(pushed_.size())) {
        End(push_status_);
        return;
      }
      block_.set_epoch(store_.epoch());
      *block_.mutable_key() = request_->keys(next_);
      block_.set_checksum(pushed_[static_cast<size_t>(next_)]);
      block_.set_in_place(true);
      ++next_;
      StartWrite(&block_);
      return;
    }
    if (next_ == request_->keys_size()) {
      End(absl::OkStatus());
      return;
    }
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
  // Set once by OnPushed, before any write of the stream: read by the writes after it.
  bool in_place_ = false;
  std::vector<uint64_t> pushed_;
  absl::Status push_status_;
};

}  // namespace

KvStoreService::KvStoreService(BlockStore& store, KvStoreMetrics* metrics, std::vector<std::string> api_keys,
                               KvStoreUcxPlane* plane)
    : store_(store), metrics_(metrics), plane_(plane), api_keys_(std::move(api_keys)), started_(absl::Now()) {}

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
  // The lease, only for an authenticated caller that asked, on blocks of the plane's size.
  if (s.ok() && request->ucx_lease() && plane_ != nullptr && request->block_bytes() == plane_->block_bytes()) {
    std::vector<StoreKey> keys;
    std::vector<uint64_t> tokens;
    for (int i = 0; i < response->blocks_size(); ++i) {
      if (response->blocks(i).outcome() != v1::KvPutIntentResponse::OUTCOME_RESERVED) continue;
      keys.push_back(FromProto(request->keys(i)));
      tokens.push_back(response->blocks(i).token());
    }
    if (!keys.empty()) {
      absl::StatusOr<std::string> descriptor = plane_->OpenPutLease(keys, tokens);
      if (descriptor.ok()) {
        response->set_ucx_lease_descriptor(*std::move(descriptor));
      } else {
        // The writer puts over the stream instead.
        KVMESH_LOG(kWarning) << "kv-store: no UCX lease for a put" << LogKv("error", descriptor.status().ToString());
      }
    }
  }
  return Finish(context, "PutIntent", s);
}

grpc::ServerReadReactor<v1::KvPutBlock>* KvStoreService::Put(grpc::CallbackServerContext* context,
                                                             v1::KvPutResponse* response) {
  return new PutReactor(store_, metrics_, response, Authenticate(*context),
                        plane_ != nullptr ? plane_->commit_wait() : absl::ZeroDuration());
}

grpc::ServerWriteReactor<v1::KvGetBlock>* KvStoreService::Get(grpc::CallbackServerContext* context,
                                                              const v1::KvGetRequest* request) {
  return new GetReactor(store_, metrics_, plane_, request, Authenticate(*context));
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
