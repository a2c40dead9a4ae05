#include "argmax/argmax.h"

#include <climits>

#include "argmax/argmax_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchArgmaxRows(const float* logits, int64_t num_rows, int64_t vocab, int32_t* out, cudaStream_t stream) {
  if (num_rows < 0 || vocab <= 0 || vocab > INT_MAX) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  argmax::ArgmaxRowsKernel<<<argmax::ArgmaxRowsGrid(num_rows), argmax::kThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
