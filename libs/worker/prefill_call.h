// PrefillCall: one Worker.Prefill call on the prefill side. It opens the PushKvBlocks
// stream to the decode worker at once, queues the prompt as a prefill-only request whose
// KV streams out layer by layer (Engine::AddPrefillOnlyRequest with a KvLayerSink: each
// layer's finished blocks are copied into chunks on the engine thread and written by the
// KvPushStream reactor while the next layers compute), releases the pinned blocks as
// soon as the prompt is computed (everything is copied by then), closes the stream, and
// replies with the first token once the receiver has imported every block. With
// WorkerState::stream_kv_layers() off (--kv_stream_layers=false) the blocks are copied
// after the prefill instead, all at once, over the same stream (for comparison).
//
// Cancellation: when the caller cancels (the decode side's request was aborted), the
// engine request is aborted (its blocks freed) and the push stream cancelled. A failed
// push aborts the engine request and fails the call with the push's status.
//
// Ownership: the gRPC reactor (PrefillReactor) owns the call until OnDone; the engine
// callbacks and the push stream hold it too (shared_ptr).
// Thread-safety: thread-safe; the call is answered exactly once.
#pragma once

#include <grpcpp/grpcpp.h>

#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

// Starts the call; returns its reactor (gRPC owns it).
grpc::ServerUnaryReactor* StartPrefillCall(WorkerState& state, const v1::PrefillRequest* request,
                                           v1::PrefillResponse* response);

}  // namespace kvmesh::worker
