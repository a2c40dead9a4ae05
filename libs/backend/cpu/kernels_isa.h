// Declarations of the kernels of one ISA build (see vec.h): included only by
// sources compiled with KVMESH_CPU_AVX512 or KVMESH_CPU_AVX2.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"
#include "backend/cpu/vec.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {

void Linear(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads);
void LinearBf16(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads);
void Embedding(const int32_t* ids, int64_t t, const void* table, ElemType type, int64_t row_stride, int64_t e,
               float* out, int num_threads);
void RmsNorm(float* residual, const float* x, int64_t t, int64_t e, const void* weight, ElemType weight_type,
             float eps, float* out, int num_threads);
void Rope(float* q, float* k, int64_t t, int64_t h, int64_t hkv, int64_t d, const int32_t* positions,
          const float* inv_freq, int num_threads);
void SiluAndMul(const float* gate_up, int64_t t, int64_t i, float* out, int num_threads);
void DenseAttention(const float* q, const float* k, const float* v, int64_t t, int64_t h, int64_t hkv, int64_t d,
                    const int32_t* positions, float scale, float* out, int num_threads);
void WriteKvCache(const float* k, const float* v, int64_t t, const int64_t* slots, void* cache, bool bf16,
                  int64_t hkv, int64_t b, int64_t d, int num_threads);
void PagedAttention(const PagedAttentionParams& params, int num_threads);

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
