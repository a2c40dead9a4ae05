// NcclCommunicator: the Communicator of GPU ranks, on NCCL (device memory; buffers
// are device pointers on this rank's GPU). Built only when CUDA and NCCL are found
// (KVMESH_HAVE_NCCL); CreateNcclCommunicator returns Unimplemented otherwise.
//
// The group meets through a Store: rank 0 makes the NCCL unique id and publishes it,
// the others read it. The communicator is non-blocking (ncclConfig_t.blocking = 0) so
// that every step can be bounded: initialisation and each collective are polled until
// done or the timeout passes, and then the communicator is aborted (ncclCommAbort) and
// DeadlineExceeded returned, never a hang. Without a queue, collectives run on the
// communicator's own stream and are complete when the call returns; with one (the
// backend's stream, as a GPU rank's forward pass uses it) they are queued on it behind
// the ops already there, may be captured into a CUDA graph, and complete through
// AwaitQueue (communicator.h, "Ordering").
//
// Thread-safety: not thread-safe (one rank thread); the calling thread's current CUDA
// device is set to `device` on every call.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/store.h"

namespace kvmesh::comm {

struct NcclCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;  // CUDA device index of this rank
  std::string group_name = "tp";
  absl::Duration timeout = absl::Seconds(60);
  // A cudaStream_t on `device` to queue collectives on (not owned), or nullptr for the
  // communicator's own stream and collectives complete on return.
  void* queue = nullptr;
};

// Unimplemented without NCCL in the build; FailedPrecondition without a usable GPU;
// errors of NCCL as Unavailable/Internal with NCCL's message (e.g. two ranks of one
// group on the same GPU, which NCCL rejects).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclCommunicatorOptions& options,
                                                                      Store& store);

// How many CUDA devices this process sees: 0 where there is no GPU or no driver
// ("insufficient driver" means none), and always 0 in a build without CUDA.
int NumCudaDevices();

}  // namespace kvmesh::comm
