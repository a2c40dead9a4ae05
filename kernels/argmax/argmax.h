// Greedy decoding on the device: the argmax of each logits row, so that a greedy step
// copies one token id to the host instead of a whole vocabulary of logits (and the host
// skips its own pass over it). Raw pointers + cudaStream_t only.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// out[r] = the lowest index of the largest logit of row r, reading each logit as the
// host sampler's greedy path does (libs/engine/sampler.cc, SanitizeLogit): NaN never
// wins, +inf counts as the largest finite float; -1 when no logit is finite.
//   logits: [num_rows, vocab] f32, device; out: [num_rows] int32, device.
// cudaErrorInvalidValue for a non-positive vocab or negative num_rows.
cudaError_t LaunchArgmaxRows(const float* logits, int64_t num_rows, int64_t vocab, int32_t* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
