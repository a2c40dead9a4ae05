// Token embedding lookup: out[t, :] = table[ids[t], :] widened to f32 (Backend::Embedding),
// and its vocab-parallel shard variant (Backend::EmbeddingShard).
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

// One rank's shard of a vocab-parallel table: table: [vocab_rows, hidden] device holds the
// rows of ids first_id .. first_id + vocab_rows - 1. out[t, :] = table[ids[t] - first_id, :]
// widened for an id in that range, else zeros (another rank's row: the all-reduce that
// follows adds exactly one non-zero row). ids: [num_tokens] int32 device, any value;
// out: [num_tokens, hidden] f32 device. cudaErrorInvalidValue for a non-positive
// vocab_rows or hidden, or a negative first_id.
cudaError_t LaunchEmbeddingShard(const int32_t* ids, int64_t num_tokens, const void* table, EmbeddingDType dtype,
                                 int64_t first_id, int64_t vocab_rows, int64_t hidden, float* out,
                                 cudaStream_t stream);

}  // namespace kvmesh::kernels
