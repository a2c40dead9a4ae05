// Communicator: the collectives a tensor-parallel group runs between its ranks
// (docs/architecture.md §4, "Tensor parallelism"). One object per rank; every rank of the group
// must issue the same collectives in the same order with the same sizes.
//
// Buffers are raw pointers into the backend's memory: host memory for the Gloo
// backend (CPU ranks), device memory for the NCCL backend (GPU ranks). Every
// collective works in place.
//
// Errors: a collective that does not complete within the communicator's timeout
// returns DeadlineExceeded; a peer that went away (closed connection) returns
// Unavailable. After any failed collective the group is broken: every later call
// returns FailedPrecondition naming the first error, so a caller cannot run on with
// ranks out of step. InvalidArgument for an unsupported dtype or a bad root.
//
// Ordering: by default a collective has completed when its call returns. A device
// communicator may instead be made over a device queue (a CUDA stream: the backend's
// queue(), NcclCommunicatorOptions::queue): each collective is then queued there behind
// the work already queued (and recorded by a graph capture in progress), and the call
// returns once it is queued. Its completion and its errors then come through
// AwaitQueue, which the caller uses wherever it would otherwise wait on that queue: a
// peer that is gone or stuck turns the wait into an error within the timeout instead of
// a hang.
//
// Thread-safety: not thread-safe; each rank's communicator is used by that rank's
// thread only.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace kvmesh::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo" or "nccl".
  virtual std::string_view backend_name() const = 0;

  // data[i] = sum over ranks of data[i]. data: [count] of dtype (f32 on every backend;
  // NCCL also bf16/f16).
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype) = 0;

  // recv[r * count .. (r + 1) * count) = rank r's send[0 .. count). recv: [world_size *
  // count]; send may be recv + rank * count (in place). Any dtype (bytes are copied).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype) = 0;

  // data on every rank = data on `root`. Any dtype.
  virtual absl::Status Broadcast(void* data, int64_t count, DType dtype, int root) = 0;

  // Returns once every rank has called Barrier (queued: once every rank's queue got there).
  virtual absl::Status Barrier() = 0;

  // The device queue collectives are queued on (see "Ordering"), or nullptr when each
  // completes within its call.
  virtual void* queue() const { return nullptr; }

  // Waits until queue() has run everything queued on it before `event` (a CUDA event
  // recorded on it; nullptr: everything queued so far), watching the group as a
  // collective does: DeadlineExceeded after the timeout, Unavailable when a peer's
  // failure surfaces; either breaks the group (and releases the queue's stuck
  // collectives). OK at once where queue() is nullptr.
  virtual absl::Status AwaitQueue(void* event) {
    (void)event;
    return absl::OkStatus();
  }
};

}  // namespace kvmesh::comm
