// Linear on AMX-BF16 for bf16 weights, with f32-level accuracy; compiled once,
// with the AVX-512 flags plus -mamx-tile -mamx-bf16 (CMakeLists.txt), and
// reached only through AmxKernels() (cpu_backend.cc checks cpuid and asks the
// kernel for tile-data permission first).
//
// Activations are not rounded to bf16: each f32 x is split exactly into three
// bf16 terms, x = t0 + t1 + t2 + r with t0 = bf16(x), t1 = bf16(x - t0),
// t2 = bf16(x - t0 - t1) (round to nearest even; the differences are exact),
// |r| <= 2^-24 |x|. A bf16 x bf16 product is exact in f32, so
//   out[m, n] = sum over k blocks kb of (t0.w + t1.w + t2.w over the block) (+ bias)
// is one f32 accumulation of 3K exact products: like the AVX-512 FMA chain,
// its error is at most ~(3K + 2) 2^-24 sum_k |x w|: the bound the tests check.
//
// Layout. Rows of x are taken 16 at a time (a "block"); its split is three
// 16-row AMX A tiles per 32 k (term 0, 1, 2; absent rows zero). The
// micro-kernel takes two blocks (32 rows of x) x one 32-column panel: two A
// registers (alternating), B0 and B1 (columns 0..15, 16..31 of the kBF16Amx
// layout, kernels.h) and four C tiles fill the eight tile registers. Per 32 k
// the C tile of a row block accumulates TDPBF16PS with term 0, 1, 2 in turn;
// the weights of a panel are loaded once per 32 rows (once per step for M <= 32).
// For M <= 32 (batched decode) K is also cut into slabs whose split x stays in
// L1 (AmxRangeSlabs); otherwise the tile loads of x from L2, not the products,
// bound the step.
//
// Batch invariance. A C tile row depends only on its A rows, the B tiles and
// the fixed order of the products (k blocks ascending; within one, terms 0,
// 1, 2), so every output is the same sequence of operations whatever M, the
// row's place in its block or batch, or the thread count; then out = C + bias.
// Every M >= 1 takes this path (no separate GEMV), so decode rows get the same
// bits as prefill rows.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/kernels_isa.h"
#include "backend/cpu/panel_output.h"

namespace kvmesh::backend::cpu {
namespace amx {
namespace {

using avx512::Max;
using avx512::Min;

constexpr int kBlockRows = 16;             // rows of x per A tile
// bf16 terms per f32 activation, the kernels' template parameter kTerms: 3 (f32-level
// accuracy, above) or 1 (the bf16 compute mode: x rounded to bf16, as vLLM and
// llama.cpp run bf16 models; ~3x the products per second).
constexpr int kExactTerms = 3;
constexpr int64_t kTileBytes = 1024;       // one 16 x 64-byte tile
constexpr int64_t kABlockBytes = 1 << 20;  // target size of a block of split x (stays in L2)
constexpr int64_t kPrefetchBlocks = 6;     // weight prefetch distance, in 32-k blocks of a panel

// Prefetches the 32-k block of weights at pf: every line, or only its first two
// (the L2 streamer then fetches the rest of the run on its own, and the 30 other
// prefetch instructions are saved). Which wins depends on how many cycles the
// products take per block. A single-threaded loop of one-row-block tile loads and
// 16-row products over 2 KiB blocks (TSC cycles per block): weights in L2, 79
// with every line, 56 with two, 53 with none; 256 MiB from DRAM, 457, 421, 494.
// engine_step_bench (SmolLM2, weights from DRAM, Linear ms, alternated): the exact
// mode (three terms) at batch 1/2/4/8, whose products are short (M rows), ran 8-17%
// faster with every line (9.6 against 11.2 at batch 1); at batch 16 it and the
// bf16 mode at batch 1 and 16 ran 3-8% faster with two.
KVMESH_VEC_INLINE void PrefetchWeightBlock(const char* pf, bool every_line) {
  if (every_line) {
#pragma GCC unroll 32
    for (int l = 0; l < 2 * kTileBytes / 64; ++l) _mm_prefetch(pf + l * 64, _MM_HINT_T0);
    return;
  }
  _mm_prefetch(pf, _MM_HINT_T0);
  _mm_prefetch(pf + 64, _MM_HINT_T0);
}

// Whether AmxSlab prefetches every line of the weights (PrefetchWeightBlock).
KVMESH_VEC_INLINE bool PrefetchEveryLine(int terms, int64_t m) { return terms > 1 && m < kBlockRows; }

// ldtilecfg's 64-byte operand (palette 1): tiles 0, 1 (A) and 4..7 (C) have
// `rows` rows, tiles 2, 3 (B) 16; all 64 bytes wide.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

constexpr TileConfig MakeTileConfig(int rows) {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = static_cast<uint8_t>(t == 2 || t == 3 ? 16 : rows);
  }
  return cfg;
}

// Static storage: GCC's _tile_loadconfig declares only 8 bytes of its operand
// as read, so a stack copy's other stores could be dropped. Index: A/C rows;
// M < 16 (one row block) uses M rows: a TDPBF16PS costs per row, and a C row's
// value does not depend on how many rows the tile has.
alignas(64) constexpr TileConfig kTileConfigs[kBlockRows + 1] = {
    MakeTileConfig(0),  MakeTileConfig(1),  MakeTileConfig(2),  MakeTileConfig(3),  MakeTileConfig(4),
    MakeTileConfig(5),  MakeTileConfig(6),  MakeTileConfig(7),  MakeTileConfig(8),  MakeTileConfig(9),
    MakeTileConfig(10), MakeTileConfig(11), MakeTileConfig(12), MakeTileConfig(13), MakeTileConfig(14),
    MakeTileConfig(15), MakeTileConfig(16)};

// Per thread that splits x (SplitActivations): the split activations, grown as needed.
struct Scratch {
  void* data = nullptr;
  int64_t bytes = 0;
  ~Scratch() { std::free(data); }
};
thread_local Scratch tls_scratch;

uint16_t* GetScratch(int64_t bytes) {
  if (bytes > tls_scratch.bytes) {
    std::free(tls_scratch.data);
    const int64_t rounded = (bytes + 4095) / 4096 * 4096;
    tls_scratch.data = std::aligned_alloc(64, static_cast<size_t>(rounded));
    if (tls_scratch.data == nullptr) {
      std::fprintf(stderr, "amx Linear: out of memory (%lld bytes)\n", static_cast<long long>(rounded));
      std::abort();
    }
    tls_scratch.bytes = rounded;
  }
  return static_cast<uint16_t*>(tls_scratch.data);
}

// One row of x (k floats) -> kTerms bf16 rows of kp (zero past k), term t at
// dst + t * term_stride.
template <int kTerms>
void SplitRow(const float* x, int64_t k, int64_t kp, uint16_t* dst, int64_t term_stride) {
  for (int64_t i = 0; i < kp; i += 16) {
    __m512 v;
    if (i + 16 <= k) {
      v = _mm512_loadu_ps(x + i);
    } else if (i < k) {
      v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (k - i)) - 1u), x + i);
    } else {
      v = _mm512_setzero_ps();
    }
#pragma GCC unroll 3
    for (int t = 0; t < kTerms; ++t) {
      const __m512i h = _mm512_castps_si512(avx512::RoundToBf16(avx512::V{v}).v);  // nearest even
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + t * term_stride + i),
                         _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
      v = _mm512_sub_ps(v, _mm512_castsi512_ps(h));  // exact
    }
  }
}

struct AmxCtx : PanelCall {
  const char* a;     // split x: [blocks][terms][16 rows][kp] bf16
  int64_t a_stride;  // kp * 2 bytes (one split row)
};

// Rows of block i (C tiles of columns 0..15 and 16..31) -> out = C + bias,
// clipped at m and n.
KVMESH_VEC_INLINE void StoreBlock(const AmxCtx& c, const float (*c0)[16], const float (*c1)[16], int64_t i,
                                  int64_t col0) {
  const int rows = static_cast<int>(Min<int64_t>(kBlockRows, c.m - i * kBlockRows));
  for (int r = 0; r < rows; ++r) {
    StorePanelRow(c.out + (i * kBlockRows + r) * c.n, _mm512_load_ps(c0[r]), _mm512_load_ps(c1[r]), c.bias, col0, c.n);
  }
}

// One 32-k block's products, term 0, 1, 2 in turn, into C tiles 4, 5 (row block 0:
// A at ak0) and 6, 7 (row block 1, when kTwo: A at ak1); B in tiles 2, 3. Two A
// registers alternate so a load need not wait for the previous products.
template <int kTerms, bool kTwo>
KVMESH_VEC_INLINE void DotTerms(const char* ak0, const char* ak1, int64_t term_bytes, int64_t a_stride) {
  static_assert(kTerms >= 1 && kTerms <= 3);
  if constexpr (kTwo) {
#pragma GCC unroll 3
    for (int t = 0; t < kTerms; ++t) {
      _tile_loadd(0, ak0 + t * term_bytes, a_stride);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_loadd(1, ak1 + t * term_bytes, a_stride);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
  } else {
    _tile_loadd(0, ak0, a_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (kTerms > 1) {
      _tile_loadd(1, ak0 + term_bytes, a_stride);
      _tile_dpbf16ps(4, 1, 2);
      _tile_dpbf16ps(5, 1, 3);
    }
    if constexpr (kTerms > 2) {
      _tile_loadd(0, ak0 + 2 * term_bytes, a_stride);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
    }
  }
}

// Row blocks i (and i + 1 when kTwo) against panel p.
template <int kTerms, bool kTwo>
void AmxBlock(const AmxCtx& c, int64_t p, int64_t i, bool prefetch) {
  const char* b = c.panels + p * c.panel_bytes;
  const int64_t term_bytes = kBlockRows * c.a_stride;
  const char* a0 = c.a + i * kTerms * term_bytes;
  const char* a1 = a0 + kTerms * term_bytes;
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (kTwo) {
    _tile_zero(6);
    _tile_zero(7);
  }
  for (int64_t kb = 0; kb < c.kb; ++kb) {
    const char* bk = b + kb * 2 * kTileBytes;
    if (prefetch) {
      // Past the panel's end is the next panel of this thread (or harmless).
      PrefetchWeightBlock(bk + kPrefetchBlocks * 2 * kTileBytes, /*every_line=*/false);
    }
    _tile_loadd(2, bk, 64);
    _tile_loadd(3, bk + kTileBytes, 64);
    DotTerms<kTerms, kTwo>(a0 + kb * 64, a1 + kb * 64, term_bytes, c.a_stride);
  }
  alignas(64) float cbuf[4][16][16];
  _tile_stored(4, cbuf[0], 64);
  _tile_stored(5, cbuf[1], 64);
  if constexpr (kTwo) {
    _tile_stored(6, cbuf[2], 64);
    _tile_stored(7, cbuf[3], 64);
  }
  StoreBlock(c, cbuf[0], cbuf[1], i, p * kPanelCols);
  if constexpr (kTwo) StoreBlock(c, cbuf[2], cbuf[3], i + 1, p * kPanelCols);
}

// ---- Small M (one or two row blocks, the batched-decode range): k slabs.
//
// The split x of all 32 k blocks is too big for L1 (48 KiB per row block at
// K = 512), so the panel-major loop above re-reads it from L2 for every panel
// and the tile loads, not the TDPBF16PS, bound the step. Here K is cut into
// slabs whose split x fits L1 (kSlabBytes); a group of kGroupPanels panels runs
// slab by slab, each panel's C tiles parked in a per-thread buffer between
// slabs. Parking C is an exact f32 store and reload and the products are still
// accumulated k blocks ascending, terms 0, 1, 2, so every output has the same
// bits as on the panel-major path (batch invariance across M holds).
constexpr int64_t kSlabBytes = 32 << 10;  // split x of one slab, all terms and row blocks
constexpr int64_t kGroupPanels = 8;
constexpr int64_t kSlabPrefetchBlocks = 6;  // weight prefetch distance, in 32-k blocks of the visit order

alignas(64) thread_local float tls_cpark[kGroupPanels][4][16][16];  // C tiles per panel of a group (pairs of row blocks)

// Panel p, k blocks [kb0, kb1) for row block 0 (and 1 when kTwo); C from / to park.
// `pf` walks the weights this thread reads next (kb1 - kb0 blocks of this visit
// are followed by those at pf_next).
template <int kTerms, bool kTwo>
void AmxSlab(const AmxCtx& c, int64_t p, int64_t kb0, int64_t kb1, bool first, float (*park)[16][16],
             const char* pf_next) {
  const char* b = c.panels + p * c.panel_bytes;
  const int64_t term_bytes = kBlockRows * c.a_stride;
  const char* a0 = c.a;
  const char* a1 = a0 + kTerms * term_bytes;
  const bool every_line = PrefetchEveryLine(kTerms, c.m);
  if (first) {
    _tile_zero(4);
    _tile_zero(5);
    if constexpr (kTwo) {
      _tile_zero(6);
      _tile_zero(7);
    }
  } else {
    _tile_loadd(4, park[0], 64);
    _tile_loadd(5, park[1], 64);
    if constexpr (kTwo) {
      _tile_loadd(6, park[2], 64);
      _tile_loadd(7, park[3], 64);
    }
  }
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    const char* bk = b + kb * 2 * kTileBytes;
    {
      const int64_t ahead = kb + kSlabPrefetchBlocks;
      PrefetchWeightBlock(ahead < kb1 ? b + ahead * 2 * kTileBytes : pf_next + (ahead - kb1) * 2 * kTileBytes,
                          every_line);
    }
    _tile_loadd(2, bk, 64);
    _tile_loadd(3, bk + kTileBytes, 64);
    DotTerms<kTerms, kTwo>(a0 + kb * 64, a1 + kb * 64, term_bytes, c.a_stride);
  }
  _tile_stored(4, park[0], 64);
  _tile_stored(5, park[1], 64);
  if constexpr (kTwo) {
    _tile_stored(6, park[2], 64);
    _tile_stored(7, park[3], 64);
  }
  if (kb1 == c.kb) {
    StoreBlock(c, park[0], park[1], 0, p * kPanelCols);
    if constexpr (kTwo) StoreBlock(c, park[2], park[3], 1, p * kPanelCols);
  }
}

template <int kTerms, bool kTwo>
void AmxRangeSlabs(const AmxCtx& c, int64_t p_begin, int64_t p_end) {
  const int64_t blocks = kTwo ? 2 : 1;
  const int64_t slab = Max<int64_t>(1, kSlabBytes / (blocks * kTerms * kBlockRows * 64));
  for (int64_t g0 = p_begin; g0 < p_end; g0 += kGroupPanels) {
    const int64_t g1 = Min(p_end, g0 + kGroupPanels);
    for (int64_t kb0 = 0; kb0 < c.kb; kb0 += slab) {
      const int64_t kb1 = Min(c.kb, kb0 + slab);
      for (int64_t p = g0; p < g1; ++p) {
        // The next visit: the next panel of this slab, else the group's first
        // panel at the next slab, else the next group's first slab.
        const char* next = p + 1 < g1   ? c.panels + (p + 1) * c.panel_bytes + kb0 * 2 * kTileBytes
                           : kb1 < c.kb ? c.panels + g0 * c.panel_bytes + kb1 * 2 * kTileBytes
                                        : c.panels + g1 * c.panel_bytes;
        AmxSlab<kTerms, kTwo>(c, p, kb0, kb1, kb0 == 0, tls_cpark[p - g0], next);
      }
    }
  }
}

template <int kTerms>
void AmxRange(const AmxCtx& c, int64_t blocks, int64_t p_begin, int64_t p_end) {
  _tile_loadconfig(&kTileConfigs[Min<int64_t>(kBlockRows, c.m)]);
  if (blocks <= 2) {
    if (blocks == 2) {
      AmxRangeSlabs<kTerms, true>(c, p_begin, p_end);
    } else {
      AmxRangeSlabs<kTerms, false>(c, p_begin, p_end);
    }
    _tile_release();
    return;
  }
  // Chunks of an even number of row blocks whose split x stays in L2; each
  // panel is read from the LLC once per chunk (once per call for M <= ~300).
  const int64_t chunk = Max<int64_t>(2, kABlockBytes / (kTerms * kBlockRows * c.a_stride) / 2 * 2);
  for (int64_t i0 = 0; i0 < blocks; i0 += chunk) {
    const int64_t i_end = Min(blocks, i0 + chunk);
    for (int64_t p = p_begin; p < p_end; ++p) {
      int64_t i = i0;
      for (; i + 2 <= i_end; i += 2) AmxBlock<kTerms, true>(c, p, i, i == i0);
      if (i < i_end) AmxBlock<kTerms, false>(c, p, i, i == i0);
    }
  }
  _tile_release();
}

// x split into [blocks][terms][16 rows][kp] bf16 (rows past m zero), in this
// thread's scratch. With M < 16 the A tiles have M rows (kTileConfigs), so the
// rows past m are never loaded and are left as they are.
template <int kTerms>
const uint16_t* SplitActivations(const float* x, int64_t m, int64_t k, int64_t kp, int64_t blocks) {
  uint16_t* a = GetScratch(blocks * kTerms * kBlockRows * kp * 2);
  const int rows_loaded = m < kBlockRows ? static_cast<int>(m) : kBlockRows;
  for (int64_t i = 0; i < blocks; ++i) {
    for (int r = 0; r < rows_loaded; ++r) {
      uint16_t* dst = a + (i * kTerms * kBlockRows + r) * kp;
      const int64_t row = i * kBlockRows + r;
      if (row < m) {
        SplitRow<kTerms>(x + row * k, k, kp, dst, kBlockRows * kp);
      } else {
        for (int t = 0; t < kTerms; ++t) std::memset(dst + t * kBlockRows * kp, 0, static_cast<size_t>(kp) * 2);
      }
    }
  }
  return a;
}

template <int kTerms>
void LinearAmx(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  const int64_t kp = (w.k + kAmxK - 1) / kAmxK * kAmxK;
  const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
  // Batched decode (blocks <= 2): each thread splits x itself, into its own scratch.
  // Split once by the calling thread, the buffer's lines sit in the other cores'
  // caches from the previous call, and rewriting them (an invalidation per line)
  // took longer than the products: M = 16, K = 1408, 27K of 72K TSC cycles per call.
  // A larger split (prefill) is done once and shared: its cost is amortised.
  const bool split_per_thread = blocks <= 2;
  const uint16_t* shared = split_per_thread ? nullptr : SplitActivations<kTerms>(x, m, w.k, kp, blocks);
  ForEachPanelRange(w.num_panels, m * w.n * w.k, num_threads, [&](int64_t p_begin, int64_t p_end) {
    const uint16_t* a = split_per_thread ? SplitActivations<kTerms>(x, m, w.k, kp, blocks) : shared;
    const AmxCtx c{PanelCallOf(w, m, out), reinterpret_cast<const char*>(a), kp * 2};
    AmxRange<kTerms>(c, blocks, p_begin, p_end);
  });
}

void Linear(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (w.type != ElemType::kBF16Amx) {
    avx512::Linear(x, m, w, out, num_threads);
    return;
  }
  if (m <= 0) return;
  LinearAmx<kExactTerms>(x, m, w, out, num_threads);
}

void LinearBf16(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (w.type != ElemType::kBF16Amx) {
    avx512::LinearBf16(x, m, w, out, num_threads);
    return;
  }
  if (m <= 0) return;
  LinearAmx<1>(x, m, w, out, num_threads);
}

}  // namespace
}  // namespace amx

const KernelTable& AmxKernels() {
  static const KernelTable table = [] {
    KernelTable t = Avx512Kernels();
    t.isa = "amx";
    t.amx_bf16 = true;
    t.linear = &amx::Linear;
    t.linear_bf16 = &amx::LinearBf16;
    return t;
  }();
  return table;
}

}  // namespace kvmesh::backend::cpu
