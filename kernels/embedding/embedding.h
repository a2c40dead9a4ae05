// Token embedding lookup: out[t, :] = table[ids[t], :] widened to f32 (Backend::Embedding).
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// The table's element type.
enum class EmbeddingDType : int32_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

// ids: [num_tokens] int32 device, each in [0, vocab) (the engine checks them on the host;
// an id outside that range writes a row of NaN rather than reading out of bounds).
// table: [vocab, hidden] device, element type `dtype`; out: [num_tokens, hidden] f32 device.
// Widening is exact. cudaErrorInvalidValue for a non-positive vocab or hidden.
cudaError_t LaunchEmbedding(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                            int64_t vocab, int64_t hidden, float* out, cudaStream_t stream);

}  // namespace kvmesh::kernels
