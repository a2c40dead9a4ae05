#include "worker/worker_service.h"

#include "worker/generate_call.h"
#include "worker/kv_push_receiver.h"
#include "worker/prefill_call.h"
#include "rpc/status_conversion.h"

namespace kvmesh::worker {

grpc::ServerWriteReactor<v1::WorkerGenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* /*context*/, const v1::WorkerGenerateRequest* request) {
  return StartGenerateCall(state_, request);
}

grpc::ServerUnaryReactor* WorkerService::Prefill(grpc::CallbackServerContext* /*context*/,
                                                 const v1::PrefillRequest* request, v1::PrefillResponse* response) {
  return StartPrefillCall(state_, request, response);
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context, const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  response->set_found(state_.IsLive(request->request_id()));
  state_.engine().Abort(request->request_id());
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerReadReactor<v1::KvBlockChunk>* WorkerService::PushKvBlocks(grpc::CallbackServerContext* /*context*/,
                                                                       v1::KvPushAck* ack) {
  return new KvPushReceiver(state_, ack);
}

}  // namespace kvmesh::worker
