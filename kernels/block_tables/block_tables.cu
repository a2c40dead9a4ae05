#include "block_tables/block_tables.h"

#include "block_tables/block_tables_kernel.cuh"

namespace kvmesh::kernels {

cudaError_t LaunchApplyBlockTableUpdates(const int32_t* updates, int64_t num_updates, int32_t* row_array,
                                         cudaStream_t stream) {
  if (num_updates < 0) return cudaErrorInvalidValue;
  if (num_updates == 0) return cudaSuccess;
  block_tables::ApplyUpdatesKernel<<<block_tables::ApplyUpdatesGrid(num_updates), block_tables::kThreads, 0,
                                     stream>>>(updates, num_updates, row_array);
  return cudaGetLastError();
}

cudaError_t LaunchGatherBlockTableRows(const int32_t* row_array, int64_t row_stride, const int32_t* rows,
                                       const int32_t* context_lens, int32_t block_size_tokens, int64_t num_seqs,
                                       int64_t out_cols, int32_t* out, cudaStream_t stream) {
  if (row_stride <= 0 || block_size_tokens <= 0 || num_seqs < 0 || out_cols < 0) return cudaErrorInvalidValue;
  if (num_seqs == 0 || out_cols == 0) return cudaSuccess;
  block_tables::GatherRowsKernel<<<block_tables::GatherRowsGrid(num_seqs, out_cols), block_tables::kThreads, 0,
                                   stream>>>(row_array, row_stride, rows, context_lens, block_size_tokens, out_cols,
                                             out);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
