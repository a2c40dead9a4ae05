#include "comm/nccl_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

#ifdef KVMESH_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <thread>
#endif

namespace kvmesh::comm {

#ifndef KVMESH_HAVE_NCCL

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclCommunicatorOptions&, Store&) {
  return absl::UnimplementedError("this build has no NCCL (configure with CUDA to get it)");
}

int NumCudaDevices() { return 0; }

#else

namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status NcclError(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string message = absl::StrCat("nccl ", what, ": ", ncclGetErrorString(r));
  if (comm != nullptr) {
    if (const char* last = ncclGetLastError(comm); last != nullptr && *last) absl::StrAppend(&message, " (", last, ")");
  }
  if (r == ncclRemoteError || r == ncclSystemError) return absl::UnavailableError(message);
  if (r == ncclInvalidUsage || r == ncclInvalidArgument) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    default: return absl::InvalidArgumentError(absl::StrCat("nccl: unsupported dtype ", ToAbsl(DTypeName(dtype))));
  }
}

class NcclCommunicator : public Communicator {
 public:
  // `stream`: the caller's queue (not owned) when `queued`, else the communicator's own.
  NcclCommunicator(const NcclCommunicatorOptions& options, ncclComm_t comm, cudaStream_t stream, bool queued)
      : rank_(options.rank), world_size_(options.world_size), device_(options.device), timeout_(options.timeout),
        comm_(comm), stream_(stream), queued_(queued) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // A healthy group finalizes (flushing its work, bounded by the timeout) and is
      // destroyed; one that cannot finalize in time is aborted.
      const ncclResult_t r = ncclCommFinalize(comm_);
      const bool finalized = (r == ncclSuccess || r == ncclInProgress) &&
                             WaitAsync(comm_, absl::Now() + timeout_) == ncclSuccess;
      if (finalized) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    if (!queued_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend_name() const override { return "nccl"; }

  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    KVMESH_ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(dtype));
    return Run("all-reduce", [&] { return ncclAllReduce(data, data, count, type, ncclSum, comm_, stream_); });
  }
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype) override {
    KVMESH_ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(dtype));
    return Run("all-gather", [&] { return ncclAllGather(send, recv, count, type, comm_, stream_); });
  }
  absl::Status Broadcast(void* data, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= world_size_)
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not in a group of ", world_size_));
    KVMESH_ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(dtype));
    return Run("broadcast", [&] { return ncclBroadcast(data, data, count, type, root, comm_, stream_); });
  }
  absl::Status Barrier() override {
    // NCCL has no barrier: an all-reduce of one value is one.
    if (barrier_buffer_ == nullptr) {
      if (cudaError_t e = cudaMalloc(&barrier_buffer_, sizeof(float)); e != cudaSuccess)
        return CudaError("barrier buffer", e);
    }
    KVMESH_RETURN_IF_ERROR(
        Run("barrier", [&] { return ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, comm_, stream_); }));
    return queued_ ? AwaitQueue(nullptr) : absl::OkStatus();
  }
  void* queue() const override { return queued_ ? stream_ : nullptr; }
  absl::Status AwaitQueue(void* event) override {
    if (!queued_) return absl::OkStatus();
    if (!broken_.ok())
      return absl::FailedPreconditionError(absl::StrCat("communicator group is broken: ", broken_.message()));
    cudaSetDevice(device_);
    return Await("queued work", static_cast<cudaEvent_t>(event), absl::Now() + timeout_);
  }

  // Polls `comm`'s async state until it leaves ncclInProgress or `deadline` passes.
  static ncclResult_t WaitAsync(ncclComm_t comm, absl::Time deadline) {
    ncclResult_t state = ncclInProgress;
    while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress) {
      if (absl::Now() >= deadline) return ncclInProgress;
      std::this_thread::yield();
    }
    return state;
  }

 private:
  template <typename Enqueue>
  absl::Status Run(const char* what, Enqueue&& enqueue) {
    if (!broken_.ok())
      return absl::FailedPreconditionError(absl::StrCat("communicator group is broken: ", broken_.message()));
    cudaSetDevice(device_);
    const absl::Time deadline = absl::Now() + timeout_;
    ncclResult_t r = enqueue();
    if (r == ncclInProgress) r = WaitAsync(comm_, deadline);
    if (r == ncclInProgress) {
      return Fail(absl::DeadlineExceededError(absl::StrCat("nccl ", what, " could not be queued within ",
                                                           absl::FormatDuration(timeout_))));
    }
    if (r != ncclSuccess) return Fail(NcclError(what, r, comm_));
    // Queued on the caller's stream: it completes there (AwaitQueue). NOTE: no stream
    // query here, which would also end a graph capture in progress.
    if (queued_) return absl::OkStatus();
    return Await(what, /*event=*/nullptr, deadline);
  }
  // Polls `event` (nullptr: the stream) until the work before it has run, watching for
  // peer errors; fails (and breaks the group) on an error or at `deadline`.
  absl::Status Await(const char* what, cudaEvent_t event, absl::Time deadline) {
    while (true) {
      const cudaError_t e = event != nullptr ? cudaEventQuery(event) : cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return Fail(CudaError(what, e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Fail(NcclError(what, async, comm_));
      if (absl::Now() >= deadline) {
        return Fail(absl::DeadlineExceededError(
            absl::StrCat("nccl ", what, " did not complete within ", absl::FormatDuration(timeout_),
                         " (a peer is gone or stuck)")));
      }
      std::this_thread::yield();
    }
  }
  absl::Status Fail(absl::Status status) {
    broken_ = status;
    // Aborting releases kernels stuck waiting for a peer that will never come.
    ncclCommAbort(comm_);
    comm_ = nullptr;
    return status;
  }

  const int rank_;
  const int world_size_;
  const int device_;
  const absl::Duration timeout_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  const bool queued_;
  void* barrier_buffer_ = nullptr;
  absl::Status broken_;
};

}  // namespace

int NumCudaDevices() {
  int n = 0;
  // cudaErrorInsufficientDriver / cudaErrorNoDevice: a machine without a GPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclCommunicatorOptions& options,
                                                                      Store& store) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("communicator rank ", options.rank, " is not in a group of ", options.world_size));
  const int devices = NumCudaDevices();
  if (options.device < 0 || options.device >= devices)
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: CUDA device ", options.device, " requested, ", devices, " visible"));
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) return CudaError("cudaSetDevice", e);

  // 1. Rank 0 makes the group's id; everyone meets through the store.
  const std::string key = absl::StrCat(options.group_name, "/nccl_unique_id");
  ncclUniqueId id;
  if (options.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError("get unique id", r, nullptr);
    KVMESH_RETURN_IF_ERROR(store.Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    KVMESH_ASSIGN_OR_RETURN(const std::string bytes, store.Get(key, options.timeout));
    if (bytes.size() != sizeof(id)) return absl::InternalError("nccl: malformed unique id in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  // 2. Non-blocking init, bounded by the timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const absl::Time deadline = absl::Now() + options.timeout;
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.world_size, id, options.rank, &config);
  if (r == ncclInProgress) r = NcclCommunicator::WaitAsync(comm, deadline);
  if (r != ncclSuccess) {
    absl::Status status = r == ncclInProgress
                              ? absl::DeadlineExceededError(absl::StrCat("nccl: group init did not complete within ",
                                                                         absl::FormatDuration(options.timeout)))
                              : NcclError("init", r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return status;
  }
  if (options.queue != nullptr) {
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(options, comm, static_cast<cudaStream_t>(options.queue), /*queued=*/true));
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    ncclCommAbort(comm);
    return CudaError("cudaStreamCreate", e);
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(options, comm, stream, /*queued=*/false));
}

#endif  // KVMESH_HAVE_NCCL

}  // namespace kvmesh::comm
