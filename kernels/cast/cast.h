// Narrowing f32 activations for a tensor-core GEMM: the backend's activations are f32
// (libs/backend/ops.h), cuBLAS's bf16/f16 GEMMs take operands of one 16-bit type.
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// out[i] = bf16(in[i]), round to nearest even (bit for bit core/dtype.h's F32ToBf16).
// in: [n] f32 device; out: [n] bf16 bits device.
cudaError_t LaunchCastF32ToBf16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream);
// out[i] = f16(in[i]), round to nearest even, overflow to infinity (__float2half_rn).
cudaError_t LaunchCastF32ToF16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
