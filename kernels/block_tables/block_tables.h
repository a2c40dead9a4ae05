// A device runner's persistent block-table rows (engine/block_tables.h): the entries that
// changed since the last step are scattered into the row array, and each step's
// [num_seqs, out_cols] block table is gathered from the rows its sequences hold, so that
// the host uploads only what changed. Raw pointers + cudaStream_t only: kernels/ includes
// no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// updates: [num_updates, 2] int32 device, (index, block) pairs with distinct indices, each
// in the row array; row_array: int32 device. Sets row_array[index] = block for each pair.
// cudaErrorInvalidValue for a negative count; nothing to do for 0.
cudaError_t LaunchApplyBlockTableUpdates(const int32_t* updates, int64_t num_updates, int32_t* row_array,
                                         cudaStream_t stream);

// row_array: [*, row_stride] int32 device; rows, context_lens: [num_seqs] int32 device;
// out: [num_seqs, out_cols] int32 device. out[i, j] = row_array[rows[i] * row_stride + j]
// for j < min(ceil(context_lens[i] / block_size_tokens), out_cols, row_stride) and
// rows[i] >= 0, else 0. Graph-capturable (fixed shape; the values are read at run time).
// cudaErrorInvalidValue for a non-positive stride or block size or a negative size.
cudaError_t LaunchGatherBlockTableRows(const int32_t* row_array, int64_t row_stride, const int32_t* rows,
                                       const int32_t* context_lens, int32_t block_size_tokens, int64_t num_seqs,
                                       int64_t out_cols, int32_t* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
