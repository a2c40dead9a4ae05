#include "sampling/sampling.h"

#include "sampling/sampling_kernel.cuh"

namespace kvmesh::kernels {

size_t SampleTopKTopPWorkspaceBytes(int64_t /*num_rows*/, int64_t /*vocab*/) { return 0; }

cudaError_t LaunchSampleTopKTopP(const float* logits, int64_t num_rows, int64_t vocab, const float* temperature,
                                 const int32_t* top_k, const float* top_p, const uint64_t* seeds,
                                 const uint64_t* offsets, int32_t* out_ids, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream) {
  if (num_rows < 0 || num_rows > 0x7fffffff || vocab <= 0 || vocab > 0x7fffffff ||
      workspace_bytes < SampleTopKTopPWorkspaceBytes(num_rows, vocab)) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  if (logits == nullptr || temperature == nullptr || top_k == nullptr || top_p == nullptr || seeds == nullptr ||
      offsets == nullptr || out_ids == nullptr) {
    return cudaErrorInvalidValue;
  }
  (void)workspace;
  sampling::SampleTopKTopPKernel<<<sampling::SampleTopKTopPGrid(num_rows), sampling::kThreads, 0, stream>>>(
      logits, vocab, temperature, top_k, top_p, seeds, offsets, out_ids);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
