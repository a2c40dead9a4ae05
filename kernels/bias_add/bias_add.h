// Adds a linear layer's bias to its GEMM output (cuBLAS writes x W^T; the bias is a
// separate pass, cheap next to the GEMM: one read and write of the [T, N] output).
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// out[t, n] += bias[n]. out: [num_rows, n] f32 device; bias: [n] f32 device.
cudaError_t LaunchBiasAddF32(float* out, const float* bias, int64_t num_rows, int64_t n, cudaStream_t stream);

}  // namespace kvmesh::kernels
