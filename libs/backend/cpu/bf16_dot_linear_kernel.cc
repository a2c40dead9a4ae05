// The bf16 compute mode's Linear on AVX512-BF16 (VDPBF16PS) for CPUs without AMX;
// compiled with the AVX-512 flags plus -mavx512bf16 (CMakeLists.txt) and reached only
// through Avx512Bf16Kernels(): isa "avx512bf16", or "auto" in the bf16 compute mode on
// an AMD CPU with AVX512_BF16 and no AMX (cpu_backend.cc says why not on Intel).
//
// Weights are packed in the AMX tile layout (kBF16Amx, cpu/kernels.h): per 32 k, two
// 1 KiB tiles whose row r holds, for each of 16 columns, the bf16 pair (k0 + 2r,
// k0 + 2r + 1): exactly one VDPBF16PS operand per row. x is rounded to bf16 (nearest
// even, vec.h RoundToBf16) and packed as the same pairs, one dword per k pair. Then
//   out[m, n] = (VDPBF16PS over the k pairs in ascending order) + bias[n],
// each instruction adding both products of a pair into the f32 accumulator.
//
// Batch invariance: an output's sequence of operations is fixed by its row of x, the
// weights and k; rows are only grouped (up to kMR per pass over a panel) for reuse of
// the weight registers, so a row's result is the same bits for every M, position in
// the batch and thread count.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/kernels_isa.h"
#include "backend/cpu/panel_output.h"

namespace kvmesh::backend::cpu {
namespace bf16dot {
namespace {

using avx512::Min;

constexpr int kMR = 8;                 // rows of x per pass over a panel: 16 accumulators
constexpr int64_t kTileBytes = 1024;   // 16 k pairs x 16 columns x 4 bytes
constexpr int64_t kPrefetchBlocks = 4;  // weight prefetch distance, in 32-k blocks

// Rows of x -> bf16 pairs, dword p of a row = (bf16(x[2p]) | bf16(x[2p + 1]) << 16),
// zero past k; kp / 2 dwords per row.
void PackPairs(const float* x, int64_t m, int64_t k, int64_t kp, uint32_t* xp) {
  for (int64_t row = 0; row < m; ++row) {
    const float* src = x + row * k;
    uint32_t* dst = xp + row * (kp / 2);
    for (int64_t i = 0; i < kp; i += 16) {
      avx512::V v = avx512::Zero();
      if (i + 16 <= k) {
        v = avx512::Load(src + i);
      } else if (i < k) {
        v = avx512::LoadPartial(src + i, static_cast<int>(k - i));
      }
      // Rounded f32 bits: bf16 in the high half. Qword j = (x[2j + 1] << 32 | x[2j]):
      // the pair's dword is (qword >> 16) & 0xffff | (qword >> 32) & 0xffff0000.
      const __m512i r = _mm512_castps_si512(avx512::RoundToBf16(v).v);
      const __m512i lo = _mm512_and_si512(_mm512_srli_epi64(r, 16), _mm512_set1_epi64(0xffff));
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi64(r, 32), _mm512_set1_epi64(0xffff0000));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i / 2), _mm512_cvtepi64_epi32(_mm512_or_si512(lo, hi)));
    }
  }
}

struct Ctx : PanelCall {
  const uint32_t* xp;  // [m][kp / 2]
  int64_t ldx;         // kp / 2
};

// Rows [row0, row0 + R) against panel p.
template <int R>
void PanelRows(const Ctx& c, int64_t p, int64_t row0) {
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const char* panel = c.panels + p * c.panel_bytes;
  const uint32_t* x = c.xp + row0 * c.ldx;
  for (int64_t b = 0; b < c.kb; ++b) {
    const char* t0 = panel + b * 2 * kTileBytes;
    // Past the panel's end is the next panel of this thread (or harmless).
    const char* pf = t0 + kPrefetchBlocks * 2 * kTileBytes;
#pragma GCC unroll 32
    for (int l = 0; l < 2 * kTileBytes / 64; ++l) _mm_prefetch(pf + l * 64, _MM_HINT_T0);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_load_si512(t0 + r * 64);
      const __m512bh w1 = (__m512bh)_mm512_load_si512(t0 + kTileBytes + r * 64);
      const int64_t pair = b * 16 + r;
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * c.ldx + pair]));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, w0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xb, w1);
      }
    }
  }
  for (int i = 0; i < R; ++i) StorePanelRow(c.out + (row0 + i) * c.n, acc[i][0], acc[i][1], c.bias, p * kPanelCols, c.n);
}

template <int R>
void RowsAny(int r, const Ctx& c, int64_t p, int64_t row0) {
  if constexpr (R > 1) {
    if (r < R) return RowsAny<R - 1>(r, c, p, row0);
  }
  PanelRows<R>(c, p, row0);
}

// Panels [p_begin, p_end), each against every row (the weights are read once).
void PanelRange(const Ctx& c, int64_t p_begin, int64_t p_end) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t row0 = 0; row0 < c.m; row0 += kMR) {
      RowsAny<kMR>(static_cast<int>(Min<int64_t>(kMR, c.m - row0)), c, p, row0);
    }
  }
}

void LinearBf16(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (w.type != ElemType::kBF16Amx) {
    avx512::LinearBf16(x, m, w, out, num_threads);
    return;
  }
  if (m <= 0) return;
  const int64_t kp = (w.k + kAmxK - 1) / kAmxK * kAmxK;
  thread_local std::vector<uint32_t> pairs;  // grow-only: no allocation per call once warm
  if (static_cast<int64_t>(pairs.size()) < m * kp / 2) pairs.resize(static_cast<size_t>(m * kp / 2));
  PackPairs(x, m, w.k, kp, pairs.data());
  const Ctx c{PanelCallOf(w, m, out), pairs.data(), kp / 2};
  ForEachPanelRange(w.num_panels, m * w.n * w.k, num_threads,
                    [&](int64_t p_begin, int64_t p_end) { PanelRange(c, p_begin, p_end); });
}

}  // namespace
}  // namespace bf16dot

const KernelTable& Avx512Bf16Kernels() {
  static const KernelTable table = [] {
    KernelTable t = Avx512Kernels();
    t.isa = "avx512bf16";
    t.bf16_pairs_in_compute_mode = true;
    t.linear_bf16 = &bf16dot::LinearBf16;
    return t;
  }();
  return table;
}

}  // namespace kvmesh::backend::cpu
