// Owning handles for CUDA memory — device memory (cudaMalloc) and pinned host memory
// (cudaHostAlloc), freed on destruction, move-only — and CUDA errors as Status: what the
// CUDA backend and the CUDA runner both use. Include only from code built with CUDA.
//
// Thread-safety: a handle is a value; the memory it owns is the owner's to synchronize.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::cuda {

// A CUDA error as a Status: ResourceExhausted for out-of-memory, Internal otherwise,
// with `what` and CUDA's own words.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
}

// Returns CudaStatus(expr, what) from the enclosing function when `expr` is not cudaSuccess.
#define KVMESH_RETURN_IF_CUDA_ERROR(expr, what) \
  KVMESH_RETURN_IF_ERROR(::kvmesh::cuda::CudaStatus((expr), (what)))

// Memory from `Allocate` (cudaMalloc or cudaHostAlloc), released by `Release`.
template <cudaError_t (*Release)(void*)>
class CudaMemory {
 public:
  CudaMemory() = default;
  CudaMemory(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  CudaMemory(CudaMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaMemory& operator=(CudaMemory&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  ~CudaMemory() { Reset(); }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (data_ != nullptr) Release(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceMemory = CudaMemory<cudaFree>;
using PinnedHostMemory = CudaMemory<cudaFreeHost>;

// `bytes` of device memory (at least 1 byte is asked for, so the pointer is never null).
inline absl::StatusOr<DeviceMemory> AllocateDevice(size_t bytes, absl::string_view what) {
  void* data = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&data, bytes > 0 ? bytes : 1), absl::StrCat("cudaMalloc of ", bytes,
                                                                                         " bytes for ", what));
      !s.ok()) {
    return s;
  }
  return DeviceMemory(data, bytes);
}

// `bytes` of page-locked host memory, so copies to and from the device run asynchronously.
inline absl::StatusOr<PinnedHostMemory> AllocatePinnedHost(size_t bytes, absl::string_view what) {
  void* data = nullptr;
  if (absl::Status s = CudaStatus(cudaHostAlloc(&data, bytes > 0 ? bytes : 1, cudaHostAllocDefault),
                                  absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ", what));
      !s.ok()) {
    return s;
  }
  return PinnedHostMemory(data, bytes);
}

}  // namespace kvmesh::cuda
