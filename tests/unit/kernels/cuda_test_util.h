// Helpers shared by the kernels/ tests: whether a GPU is here, and device copies of
// host vectors.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace kvmesh::kernels::test_util {

// False (with the reason in *why) where no CUDA device can be used. cudaGetDeviceCount
// says "driver version is insufficient" on machines without a GPU driver: no GPU, not an error.
inline bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = cudaGetErrorString(err);
    return false;
  }
  if (count == 0) *why = "no CUDA device";
  return count > 0;
}

#define KVMESH_SKIP_WITHOUT_GPU()                                                                          \
  do {                                                                                                     \
    std::string kvmesh_why;                                                                                \
    if (!::kvmesh::kernels::test_util::HaveGpu(&kvmesh_why)) {                                               \
      GTEST_SKIP() << "no GPU here (" << kvmesh_why << "); this CUDA test runs where one is (tools/gpu-check)"; \
    }                                                                                                      \
  } while (0)

// Device memory holding a copy of a host vector; freed on destruction. Copy failures
// are test failures (ADD_FAILURE), and Download then returns what it could.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    if (cudaMalloc(&data_, Bytes() > 0 ? Bytes() : 1) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << Bytes() << " bytes failed";
      data_ = nullptr;
      return;
    }
    if (cudaMemcpy(data_, host.data(), Bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
      ADD_FAILURE() << "cudaMemcpy to the device failed";
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  T* get() const { return data_; }
  // Waits for the device, then copies the buffer back.
  std::vector<T> Download() const {
    std::vector<T> host(size_);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << "kernel or copy back failed: " << cudaGetErrorString(cudaGetLastError());
    }
    return host;
  }

 private:
  size_t Bytes() const { return size_ * sizeof(T); }

  size_t size_ = 0;
  T* data_ = nullptr;
};

}  // namespace kvmesh::kernels::test_util
