// The kvmesh.v1.Worker service of a worker process (worker.h): thin gRPC
// callback reactors over the worker's AsyncEngine (WorkerState), for either role.
//   - Generate (decode side): GenerateCall (worker/generate_call.h).
//   - Prefill (prefill side): PrefillCall (worker/prefill_call.h), streaming each
//     layer's KV to the decode worker as soon as it is computed.
//   - PushKvBlocks (decode side): KvPushReceiver (worker/kv_push_receiver.h).
//   - Abort.
//
// Thread-safety: thread-safe (gRPC calls it from its threads).
#pragma once

#include <grpcpp/grpcpp.h>

#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // `state` must outlive the service.
  explicit WorkerService(WorkerState& state) : state_(state) {}

  grpc::ServerWriteReactor<v1::WorkerGenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                                 const v1::WorkerGenerateRequest* request) override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context, const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerReadReactor<v1::KvBlockChunk>* PushKvBlocks(grpc::CallbackServerContext* context,
                                                          v1::KvPushAck* ack) override;

 private:
  WorkerState& state_;
};

}  // namespace kvmesh::worker
