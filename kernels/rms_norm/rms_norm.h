// RMSNorm launcher: out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// x, out: [num_tokens, hidden] f32 (may alias); weight: [hidden] bf16 bits.
cudaError_t LaunchRmsNormF32Bf16Weight(const float* x, const uint16_t* weight, float eps, int64_t num_tokens,
                                      int64_t hidden, float* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
