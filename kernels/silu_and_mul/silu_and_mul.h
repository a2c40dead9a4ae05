// SwiGLU's activation: out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i].
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// gate_up: [num_tokens, 2 * intermediate] f32 (gate half first, as the fused gate/up GEMM
// writes it); out: [num_tokens, intermediate] f32, not overlapping gate_up.
// silu(a) = a / (1 + exp(-a)), computed in f32 (expf, IEEE division).
cudaError_t LaunchSiluAndMulF32(const float* gate_up, int64_t num_tokens, int64_t intermediate, float* out,
                                cudaStream_t stream);

}  // namespace kvmesh::kernels
