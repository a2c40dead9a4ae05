// Linear on AMX-BF16 for bf16 weights, with f32-level accuracy; compiled once,
// with the AVX-512 flags plus -mamx-tile -mamx-bf16 (CMakeLists.txt), and
// reached only through AmxKernels() (cpu_backend.cc checks cpuid and asks the
// kernel for tile-data permission first).
//
// Activations are not rounded to bf16: each f32 x is split exactly into
// x = hi + lo + r with hi = bf16(x), lo = bf16(x - hi) (both round to nearest
// even; x - hi is exact), |r| <= 2^-16 |x|. hi*w and lo*w are exact in f32 for
// a bf16 weight w, so
//   out[m, n] = (sum_k hi[m, k] w[n, k]) + (sum_k lo[m, k] w[n, k]) (+ bias[n])
// misses the f32 product sum by at most 2^-16 sum_k |x w| plus the two chains'
// f32 rounding (~K 2^-24 sum_k |x w|): the bound the tests check.
//
// Layout. Eight rows of x form a group: one 16-row AMX A tile holds their hi
// parts in tile rows 0..7 and their lo parts in rows 8..15 (absent rows are
// zero), so one TDPBF16PS against a weight tile (32 k x 16 columns, the
// kBF16Amx layout of kernels.h) yields both partial sums of 8 rows. The
// micro-kernel takes two groups (16 rows of x) x one 32-column panel: A0, A1,
// B0, B1 and four C tiles fill the eight tile registers; the weights of a
// panel are loaded once per 16 rows (once per step for M <= 16).
//
// Batch invariance. A C tile row depends only on its A row, the B tiles and
// the order of the K blocks, which is fixed (k = 0, 32, 64, ...), so every
// output is the same sequence of operations whatever M, the row's place in
// its group or batch, or the thread count; then out = (hi sum + lo sum) + bias
// in that order. Every M >= 1 takes this path (no separate GEMV), so decode
// rows get the same bits as prefill rows.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/kernels_isa.h"

namespace kvmesh::backend::cpu {
namespace amx {
namespace {

using avx512::Max;
using avx512::Min;

constexpr int kGroupRows = 8;              // rows of x per A tile (hi + lo = 16 tile rows)
constexpr int64_t kTileBytes = 1024;       // one 16 x 64-byte tile
constexpr int64_t kABlockBytes = 1 << 20;  // target size of a block of split x (stays in L2)
constexpr int64_t kPrefetchBlocks = 2;     // weight prefetch distance, in 32-k blocks of a panel

// ldtilecfg's 64-byte operand (palette 1): all eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);
// Static storage: GCC's _tile_loadconfig declares only 8 bytes of its operand
// as read, so a stack copy's other stores could be dropped.
alignas(64) const TileConfig kTileConfig = {
    .palette_id = 1,
    .start_row = 0,
    .reserved = {},
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0},
};

// Per calling thread: the split activations, grown as needed.
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

// f32 bits rounded to nearest even at bf16 precision, as f32 bits (low 16 zero).
// Finite inputs only (activations); x near FLT_MAX may round to infinity.
KVMESH_VEC_INLINE __m512i RoundToBf16(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

// One row of x (k floats) -> hi and lo rows of kp bf16 (zero past k).
void SplitRow(const float* x, int64_t k, int64_t kp, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < kp; i += 16) {
    __m512 v;
    if (i + 16 <= k) {
      v = _mm512_loadu_ps(x + i);
    } else if (i < k) {
      v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (k - i)) - 1u), x + i);
    } else {
      v = _mm512_setzero_ps();
    }
    const __m512i h = RoundToBf16(_mm512_castps_si512(v));
    const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(h));  // exact
    const __m512i l = RoundToBf16(_mm512_castps_si512(rest));
    _mm256_store_si256(reinterpret_cast<__m256i*>(hi + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16)));
  }
}

struct AmxCtx {
  const char* a;     // split x: [groups][16 rows][kp] bf16
  int64_t a_stride;  // kp * 2 bytes
  int64_t kb;        // kp / 32
  int64_t m;
  int64_t n;
  const char* panels;
  int64_t panel_bytes;  // kp * 64
  const float* bias;
  float* out;
};

// Rows of group g (C tiles hi/lo of columns 0..15 and 16..31, [16][16] each)
// -> out = (hi + lo) + bias, clipped at m and n.
KVMESH_VEC_INLINE void StoreGroup(const AmxCtx& c, const float (*c0)[16], const float (*c1)[16], int64_t g,
                                  int64_t col0) {
  const int rows = static_cast<int>(Min<int64_t>(kGroupRows, c.m - g * kGroupRows));
  const int64_t cols = Min<int64_t>(32, c.n - col0);
  const __mmask16 mask0 = cols >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << cols) - 1u);
  const __mmask16 mask1 = cols >= 32 ? __mmask16{0xffff}
                          : cols <= 16 ? __mmask16{0}
                                       : static_cast<__mmask16>((1u << (cols - 16)) - 1u);
  __m512 b0 = _mm512_setzero_ps();
  __m512 b1 = _mm512_setzero_ps();
  if (c.bias != nullptr) {  // the bias is padded to whole panels
    b0 = _mm512_loadu_ps(c.bias + col0);
    b1 = _mm512_loadu_ps(c.bias + col0 + 16);
  }
  for (int r = 0; r < rows; ++r) {
    float* o = c.out + (g * kGroupRows + r) * c.n + col0;
    __m512 v0 = _mm512_add_ps(_mm512_load_ps(c0[r]), _mm512_load_ps(c0[kGroupRows + r]));
    __m512 v1 = _mm512_add_ps(_mm512_load_ps(c1[r]), _mm512_load_ps(c1[kGroupRows + r]));
    if (c.bias != nullptr) {
      v0 = _mm512_add_ps(v0, b0);
      v1 = _mm512_add_ps(v1, b1);
    }
    _mm512_mask_storeu_ps(o, mask0, v0);
    if (mask1 != 0) _mm512_mask_storeu_ps(o + 16, mask1, v1);
  }
}

// Groups g (and g + 1 when kTwo) against panel p.
template <bool kTwo>
void AmxBlock(const AmxCtx& c, int64_t p, int64_t g, bool prefetch) {
  const char* b = c.panels + p * c.panel_bytes;
  const char* a0 = c.a + g * 16 * c.a_stride;
  const char* a1 = a0 + 16 * c.a_stride;
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
      const char* pf = bk + kPrefetchBlocks * 2 * kTileBytes;
#pragma GCC unroll 32
      for (int l = 0; l < 2 * kTileBytes / 64; ++l) _mm_prefetch(pf + l * 64, _MM_HINT_T0);
    }
    _tile_loadd(2, bk, 64);
    _tile_loadd(3, bk + kTileBytes, 64);
    _tile_loadd(0, a0 + kb * 64, c.a_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (kTwo) {
      _tile_loadd(1, a1 + kb * 64, c.a_stride);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  alignas(64) float cbuf[4][16][16];
  _tile_stored(4, cbuf[0], 64);
  _tile_stored(5, cbuf[1], 64);
  if constexpr (kTwo) {
    _tile_stored(6, cbuf[2], 64);
    _tile_stored(7, cbuf[3], 64);
  }
  StoreGroup(c, cbuf[0], cbuf[1], g, p * kPanelCols);
  if constexpr (kTwo) StoreGroup(c, cbuf[2], cbuf[3], g + 1, p * kPanelCols);
}

void AmxRange(const AmxCtx& c, int64_t groups, int64_t p_begin, int64_t p_end) {
  _tile_loadconfig(&kTileConfig);
  // Blocks of an even number of groups whose split x stays in L2; each panel
  // is read from the LLC once per block (once per call for M <= ~1000).
  const int64_t block = Max<int64_t>(2, kABlockBytes / (16 * c.a_stride) / 2 * 2);
  for (int64_t g0 = 0; g0 < groups; g0 += block) {
    const int64_t g_end = Min(groups, g0 + block);
    for (int64_t p = p_begin; p < p_end; ++p) {
      int64_t g = g0;
      for (; g + 2 <= g_end; g += 2) AmxBlock<true>(c, p, g, g == g0);
      if (g < g_end) AmxBlock<false>(c, p, g, g == g0);
    }
  }
  _tile_release();
}

void LinearAmx(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  const int64_t kp = (w.k + kAmxK - 1) / kAmxK * kAmxK;
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  uint16_t* a = GetScratch(groups * 16 * kp * 2);
  for (int64_t g = 0; g < groups; ++g) {
    for (int r = 0; r < kGroupRows; ++r) {
      uint16_t* hi = a + (g * 16 + r) * kp;
      uint16_t* lo = hi + kGroupRows * kp;
      const int64_t row = g * kGroupRows + r;
      if (row < m) {
        SplitRow(x + row * w.k, w.k, kp, hi, lo);
      } else {
        std::memset(hi, 0, static_cast<size_t>(kp) * 2);
        std::memset(lo, 0, static_cast<size_t>(kp) * 2);
      }
    }
  }
  const AmxCtx c = {
      .a = reinterpret_cast<const char*>(a),
      .a_stride = kp * 2,
      .kb = kp / kAmxK,
      .m = m,
      .n = w.n,
      .panels = static_cast<const char*>(w.data),
      .panel_bytes = kp * kPanelCols * 2,
      .bias = w.bias,
      .out = out,
  };
  const int64_t panels = w.num_panels;
  const int64_t work = m * w.n * w.k;
  const int threads = work < (1 << 16) ? 1 : static_cast<int>(Min<int64_t>(num_threads, panels));
  if (threads <= 1) {
    AmxRange(c, groups, 0, panels);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    AmxRange(c, groups, panels * tid / nt, panels * (tid + 1) / nt);
  }
}

void Linear(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (w.type != ElemType::kBF16Amx) {
    avx512::Linear(x, m, w, out, num_threads);
    return;
  }
  if (m <= 0) return;
  LinearAmx(x, m, w, out, num_threads);
}

}  // namespace
}  // namespace amx

const KernelTable& AmxKernels() {
  static const KernelTable table = [] {
    KernelTable t = Avx512Kernels();
    t.isa = "amx";
    t.amx_bf16 = true;
    t.linear = &amx::Linear;
    return t;
  }();
  return table;
}

}  // namespace kvmesh::backend::cpu
