// The ISA-neutral face of the CPU kernels: plain structs and one table of
// function pointers per instruction set. cpu_backend.cc picks a table at run
// time (cpuid); the tables are defined by sources compiled once per ISA.
//
// This header includes nothing but <cstdint> so that ISA-specific translation
// units can include it without instantiating shared inline code.
#pragma once

#include <cstdint>

namespace kvmesh::backend::cpu {

// Output columns per weight panel. Both ISAs read the same packed layout.
inline constexpr int kPanelCols = 32;

// kBF16Amx appears only in PackedPanels packed for a table with amx_bf16 set.
enum class ElemType : uint8_t { kF32, kBF16, kF16, kBF16Amx };

// AMX (kBF16Amx) panels: K is padded with zeros to a multiple of kAmxK.
inline constexpr int kAmxK = 32;

// A linear layer packed into panels of kPanelCols output columns.
// Panel p, reduction index k holds the weights of columns p*32 .. p*32+31:
//  - kF32: 32 floats in column order;
//  - kBF16: 16 dwords, dword j = (column j in its low half, column 16+j in its
//    high half), so that `w << 16` and `w & 0xffff0000` widen to f32 without a
//    shuffle (see vec.h Bf16Low/Bf16High).
//  - kBF16Amx (the AMX table only): K padded with zeros to kp = a multiple of
//    32; per block of 32 k, two 1 KiB AMX B tiles in the VNNI layout, columns
//    0..15 then 16..31: tile row r (k pair 2r, 2r+1) holds, for column j,
//    bf16 pair (w[j][k0 + 2r], w[j][k0 + 2r + 1]). A panel is kp * 64 bytes.
// Columns past `n` in the last panel are zero. Panels are 64-byte aligned.
struct PackedPanels {
  const void* data = nullptr;  // [num_panels, k, 32]
  ElemType type = ElemType::kF32;
  int64_t n = 0;
  int64_t k = 0;
  int64_t num_panels = 0;
  const float* bias = nullptr;  // [num_panels * 32] (zero past n), or nullptr
};

// One PagedAttention call (ops.h PagedAttentionBatch) as raw pointers.
struct PagedAttentionParams {
  const float* q = nullptr;             // [t, h, d]
  const void* kv_cache = nullptr;       // [num_blocks, 2, hkv, block_size, d] (kv/kv_layout.h), f32 or bf16
  bool kv_bf16 = false;                 // kv_cache holds bf16 (else f32)
  const int32_t* query_start = nullptr;  // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t num_seqs = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t h = 0;
  int64_t hkv = 0;
  int64_t d = 0;  // a multiple of 16
  int64_t block_size = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [t, h, d]
};

struct KernelTable {
  const char* isa;
  // Pack bf16 linear weights as kBF16Amx (else kBF16) for `linear`.
  bool amx_bf16;
  // In the bf16 compute mode, pack every linear weight as kBF16Amx for `linear_bf16`
  // (its VDPBF16PS reads the same k pairs as an AMX B tile).
  bool bf16_pairs_in_compute_mode;
  // out[m, :] = x[m, :] . W^T (+ bias). x: [m, k] f32; out: [m, n] f32. Every
  // output element is one FMA chain over k = 0..K-1 in order, then + bias, so a
  // row's result does not depend on m or on its position in the batch.
  void (*linear)(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads);
  // The bf16 compute mode (ops.h CpuBackendOptions::compute_dtype) for bf16 panels:
  // each x rounded to the nearest bf16 first, then bf16 x bf16 products (exact in f32)
  // summed in f32 in a fixed order (one FMA chain here, TDPBF16PS pairs on AMX), so a
  // row's result still does not depend on m or on its position in the batch.
  void (*linear_bf16)(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads);
  // out[t, :] = table[ids[t], :] widened. table row stride in elements.
  void (*embedding)(const int32_t* ids, int64_t t, const void* table, ElemType type, int64_t row_stride,
                    int64_t e, float* out, int num_threads);
  // residual may be nullptr (plain RmsNorm); else residual += x first, then normalised.
  void (*rms_norm)(float* residual, const float* x, int64_t t, int64_t e, const void* weight, ElemType weight_type,
                   float eps, float* out, int num_threads);
  // q: [t, h, d], k: [t, hkv, d], rotated in place.
  void (*rope)(float* q, float* k, int64_t t, int64_t h, int64_t hkv, int64_t d, const int32_t* positions,
               const float* inv_freq, int num_threads);
  // gate_up: [t, 2i]; out: [t, i].
  void (*silu_and_mul)(const float* gate_up, int64_t t, int64_t i, float* out, int num_threads);
  // q: [t, h, d]; k, v: [s, hkv, d]; out: [t, h, d].
  void (*dense_attention)(const float* q, const float* k, const float* v, int64_t t, int64_t h, int64_t hkv,
                          int64_t d, const int32_t* positions, float scale, float* out, int num_threads);
  // Writes k / v[i, :, :] into slot slots[i] of cache: [num_blocks, 2, hkv, b x d]
  // (kv/kv_layout.h: K [d][b], V [b][d] per head), f32, or bf16 rounded to nearest
  // even when `bf16`. k, v: [t, hkv, d]. Slots must be distinct.
  void (*write_kv_cache)(const float* k, const float* v, int64_t t, const int64_t* slots, void* cache, bool bf16,
                         int64_t hkv, int64_t b, int64_t d, int num_threads);
  // ops.h PagedAttention; see cpu/paged_attention_kernel.cc for the reduction order.
  void (*paged_attention)(const PagedAttentionParams& params, int num_threads);
};

// Defined by the per-ISA builds. Call only when the CPU supports that ISA.
const KernelTable& Avx512Kernels();
const KernelTable& Avx2Kernels();
// The AVX-512 table with an AMX-BF16 linear for bf16 weights. Call only when the
// CPU has AVX-512 and AMX-BF16 and the process may use AMX tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA succeeded).
const KernelTable& AmxKernels();
// The AVX-512 table whose bf16-compute-mode Linear uses VDPBF16PS. Call only when the
// CPU has AVX-512 and AVX512_BF16.
const KernelTable& Avx512Bf16Kernels();

}  // namespace kvmesh::backend::cpu
