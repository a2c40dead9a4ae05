// GenerateCall: one Worker.Generate call on the decode side, a server write reactor fed
// by the engine thread.
//   - Without a prefill worker in the request (or with prefill_locally) the request is
//     prefilled here like any other.
//   - With one: leases destination blocks (Engine::ReserveForRemotePrefill), registers
//     the lease for PushKvBlocks (KvPushReceiver), asks the prefill worker to fill it
//     (Prefill), and on its reply commits the first token (CommitRemotePrefill) — only
//     then, so every layer has landed. When the remote prefill fails first (the prefill
//     worker refused, died, or hung: its channel's keepalive, UCX's progress deadline,
//     or the Prefill deadline in proportion to the prompt), the lease fails (blocks
//     freed) and the request is prefilled here instead (Engine::FallBackToLocalPrefill;
//     --remote-prefill-fallback=false fails it with the status instead), and an
//     unreachable prefill worker is reported to the scheduler.
//   - A migrated request (resume_output_token_ids) is always prefilled here.
//   - When the request ends before its Prefill returned (the client disconnected, Abort,
//     lease expiry), the Prefill call is cancelled, so the prefill worker stops and frees
//     its blocks too.
//   - Metrics (when the worker has them): prompt and generation tokens, finished samples
//     by reason, and this worker's time to first token, inter-token and end-to-end
//     latency.
//
// Ownership: deleted when both gRPC (OnDone) and the engine (final output, or a failed
// submit) are done with it. Thread-safety: gRPC and engine callbacks synchronize on a
// mutex never held across a reactor call.
#pragma once

#include <grpcpp/grpcpp.h>

#include "kvmesh/v1/worker.grpc.pb.h"
#include "worker/worker_state.h"

namespace kvmesh::worker {

// Starts the call; returns its reactor (gRPC owns it).
grpc::ServerWriteReactor<v1::WorkerGenerateResponse>* StartGenerateCall(WorkerState& state,
                                                                        const v1::WorkerGenerateRequest* request);

}  // namespace kvmesh::worker
