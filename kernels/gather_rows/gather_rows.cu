#include "gather_rows/gather_rows.h"

#include "gather_rows/gather_rows_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchGatherAddRowsF32(const float* a, const float* b, const int32_t* rows, int64_t num_rows,
                                   int64_t width, float* out, cudaStream_t stream) {
  if (num_rows < 0 || width < 0) return cudaErrorInvalidValue;
  if (num_rows == 0 || width == 0) return cudaSuccess;
  gather_rows::GatherAddRowsKernel<<<gather_rows::GatherAddRowsGrid(num_rows, width), gather_rows::kThreads, 0,
                                     stream>>>(a, b, rows, width, out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
