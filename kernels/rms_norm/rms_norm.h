// RMSNorm launchers: out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight, and the
// fused form that first adds a sublayer's output into the residual stream.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
// Each returns the launch's cudaError_t (cudaSuccess for num_tokens == 0).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// x, out: [num_tokens, hidden] f32 (may alias); weight: [hidden] bf16 bits.
cudaError_t LaunchRmsNormF32Bf16Weight(const float* x, const uint16_t* weight, float eps, int64_t num_tokens,
                                      int64_t hidden, float* out, cudaStream_t stream);
// As above with an f32 weight: [hidden].
cudaError_t LaunchRmsNormF32F32Weight(const float* x, const float* weight, float eps, int64_t num_tokens,
                                     int64_t hidden, float* out, cudaStream_t stream);

// residual += x; out = RmsNorm(residual) * weight, in one pass over each row.
// residual, x, out: [num_tokens, hidden] f32; out may alias x or residual (each element
// is read and written by the same thread). The sum is added in f32, as the CPU backends do.
cudaError_t LaunchAddRmsNormF32Bf16Weight(float* residual, const float* x, const uint16_t* weight, float eps,
                                         int64_t num_tokens, int64_t hidden, float* out, cudaStream_t stream);
cudaError_t LaunchAddRmsNormF32F32Weight(float* residual, const float* x, const float* weight, float eps,
                                        int64_t num_tokens, int64_t hidden, float* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
