// Picks the rows whose logits a step wants and finishes their residual stream in one
// pass: out[i, :] = a[rows[i], :] + b[rows[i], :] (the last layer's residual + its MLP
// output), so the final norm and LM head run on those rows only.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// a, b: [*, width] f32 device; rows: [num_rows] int32 device (valid rows of a and b);
// out: [num_rows, width] f32 device, not overlapping a or b. The sum is one f32 add, as
// the CPU runner computes it.
cudaError_t LaunchGatherAddRowsF32(const float* a, const float* b, const int32_t* rows, int64_t num_rows,
                                   int64_t width, float* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
