// Linear (GEMM/GEMV) over panel-packed weights; compiled once per ISA (vec.h).
//
// Two paths, one arithmetic. Every output element out[m, n] is computed as
//   acc = 0; for k in 0..K-1: acc = fma(x[m, k], w[n, k], acc); out = acc + bias[n]
// with the weight widened to f32 exactly. Both paths perform exactly these
// operations (a partial sum parked in `out` between K blocks is an exact f32),
// so a row's result is bitwise independent of M, of its position in the batch
// and of the thread count.
//  - M <= 8 (decode): GEMV. Each thread streams its contiguous range of panels
//    once, converting bf16 in registers; several panels are interleaved to give
//    the FMA chains enough independent accumulators.
//  - M > 8 (batched decode, prefill): blocked GEMM. The micro-kernel reads a
//    K-block of one panel straight from the packed weights (bf16 widened in
//    registers: one shift and one and per 32 weights, shared by the tile's
//    rows) against an MR-row tile of x. The M rows of an MC block are split
//    into tiles of at most kMR rows, balanced (M = 16 -> 8 + 8), so that no
//    narrow remainder tile re-reads the panel for a few rows.
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "backend/cpu/kernels_isa.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {
namespace {

constexpr int kNV = kPanelCols / kLanes;  // vectors per panel row
#if defined(KVMESH_CPU_AVX512)
constexpr int kMR = 12;       // GEMM micro-kernel rows: 24 accumulators of 32
constexpr int kGemvRows = 8;  // GEMV rows per pass over the weights
#else
constexpr int kMR = 3;  // 12 accumulators of 16
constexpr int kGemvRows = 3;
#endif
constexpr int64_t kPrefetchBytes = 4096;   // GEMV software prefetch distance
constexpr int64_t kKC = 256;               // K block of the GEMM
constexpr int64_t kABlockBytes = 1 << 20;  // target size of an MC x K block of x

template <ElemType T>
KVMESH_VEC_INLINE void LoadPanelRow(const void* panel, int64_t k, V* w) {
  if constexpr (T == ElemType::kF32) {
    const float* p = static_cast<const float*>(panel) + k * kPanelCols;
#pragma GCC unroll 4
    for (int i = 0; i < kNV; ++i) w[i] = Load(p + i * kLanes);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kPanelCols;
#pragma GCC unroll 4
    for (int i = 0; i < kNV / 2; ++i) {
      const VI pair = LoadI(p + i * 2 * kLanes);
      w[i] = Bf16Low(pair);
      w[kNV / 2 + i] = Bf16High(pair);
    }
  }
}

// Writes one row of a panel's results: columns col0 .. col0+31, clipped at n.
KVMESH_VEC_INLINE void StoreRow(float* out_row, const V* acc, const float* bias, int64_t col0, int64_t n) {
#pragma GCC unroll 4
  for (int i = 0; i < kNV; ++i) {
    const int64_t c = col0 + i * kLanes;
    if (c >= n) break;
    const V r = bias != nullptr ? Add(acc[i], Load(bias + c)) : acc[i];
    if (c + kLanes <= n) {
      Store(out_row + c, r);
    } else {
      StorePartial(out_row + c, r, static_cast<int>(n - c));
    }
  }
}

KVMESH_VEC_INLINE void LoadRowPartial(const float* row, V* acc, int64_t col0, int64_t n) {
#pragma GCC unroll 4
  for (int i = 0; i < kNV; ++i) {
    const int64_t c = col0 + i * kLanes;
    if (c >= n) {
      acc[i] = Zero();
    } else if (c + kLanes <= n) {
      acc[i] = Load(row + c);
    } else {
      acc[i] = LoadPartial(row + c, static_cast<int>(n - c));
    }
  }
}

struct LinearCtx {
  const float* x;
  int64_t m;
  int64_t k;
  int64_t n;
  const char* panels;
  int64_t panel_bytes;
  const float* bias;
  float* out;
};

// ---- GEMV: R rows of x against P consecutive panels starting at panel p. ----
template <ElemType T, int R, int P>
void GemvBlock(const LinearCtx& c, const float* x, float* out, int64_t p) {
  V acc[R][P][kNV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 4
      for (int i = 0; i < kNV; ++i) acc[r][q][i] = Zero();
  const char* base = c.panels + p * c.panel_bytes;
  constexpr int64_t kRowBytes = kPanelCols * (T == ElemType::kBF16 ? 2 : 4);
  for (int64_t k = 0; k < c.k; ++k) {
    // NOTE: the hardware prefetcher keeps too few lines in flight per stream to
    // cover DRAM latency when the FMAs slow the stream down (M > 1): prefetch
    // kPrefetchBytes ahead in every panel (past a panel's end is the next one).
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q) {
#pragma GCC unroll 2
      for (int64_t off = 0; off < kRowBytes; off += 64)
        Prefetch(base + q * c.panel_bytes + k * kRowBytes + off + kPrefetchBytes);
    }
    V w[P][kNV];
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q) LoadPanelRow<T>(base + q * c.panel_bytes, k, w[q]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V a = Set1(x[r * c.k + k]);
#pragma GCC unroll 8
      for (int q = 0; q < P; ++q)
#pragma GCC unroll 4
        for (int i = 0; i < kNV; ++i) acc[r][q][i] = Fma(a, w[q][i], acc[r][q][i]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q) StoreRow(out + r * c.n, acc[r][q], c.bias, (p + q) * kPanelCols, c.n);
}

template <ElemType T, int R>
void GemvRange(const LinearCtx& c, const float* x, float* out, int64_t p_begin, int64_t p_end) {
  // Independent accumulators wanted: ~8 (FMA latency 4 x 2 ports).
  constexpr int kP = Max(1, 8 / (R * kNV));
  int64_t p = p_begin;
  if constexpr (kP > 1) {
    for (; p + kP <= p_end; p += kP) GemvBlock<T, R, kP>(c, x, out, p);
  }
  for (; p < p_end; ++p) GemvBlock<T, R, 1>(c, x, out, p);
}

template <ElemType T>
void GemvRowsSingle(const LinearCtx& c, const float* x, float* out, int rows, int64_t p_begin, int64_t p_end) {
  switch (rows) {
    case 1:
      return GemvRange<T, 1>(c, x, out, p_begin, p_end);
    case 2:
      return GemvRange<T, 2>(c, x, out, p_begin, p_end);
    case 3:
      return GemvRange<T, 3>(c, x, out, p_begin, p_end);
#if defined(KVMESH_CPU_AVX512)
    case 4:
      return GemvRange<T, 4>(c, x, out, p_begin, p_end);
    case 5:
      return GemvRange<T, 5>(c, x, out, p_begin, p_end);
    case 6:
      return GemvRange<T, 6>(c, x, out, p_begin, p_end);
    case 7:
      return GemvRange<T, 7>(c, x, out, p_begin, p_end);
    case 8:
      return GemvRange<T, 8>(c, x, out, p_begin, p_end);
#endif
    default:
      return;
  }
}

template <ElemType T>
void Gemv(const LinearCtx& c, int64_t p_begin, int64_t p_end) {
  if (c.m <= kGemvRows) {
    GemvRowsSingle<T>(c, c.x, c.out, static_cast<int>(c.m), p_begin, p_end);
    return;
  }
  // More rows than registers allow: per panel, pass over it once per row group;
  // the panel is still in L2 for the later groups.
  for (int64_t p = p_begin; p < p_end; ++p) {
    for (int64_t r0 = 0; r0 < c.m; r0 += kGemvRows) {
      const int rows = static_cast<int>(Min<int64_t>(kGemvRows, c.m - r0));
      GemvRowsSingle<T>(c, c.x + r0 * c.k, c.out + r0 * c.n, rows, p, p + 1);
    }
  }
}

// ---- GEMM micro-kernel: R rows x 32 columns, one K block of packed weights. ----
// b: the panel's K block (row k at b + k * 32 elements of T).
template <ElemType T, int R>
void Micro(const float* a, int64_t lda, const void* b, int64_t kc, float* out, int64_t ldo, int64_t col0, int64_t n,
           bool accumulate, const float* bias, bool prefetch) {
  constexpr int64_t kRowBytes = kPanelCols * (T == ElemType::kBF16 ? 2 : 4);
  V acc[R][kNV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (accumulate) {
      LoadRowPartial(out + r * ldo, acc[r], col0, n);
    } else {
#pragma GCC unroll 4
      for (int i = 0; i < kNV; ++i) acc[r][i] = Zero();
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    // The first tile of a K block streams the panel from the LLC: prefetch
    // ahead as the GEMV does (the later tiles find it in L1/L2).
    if (prefetch) {
#pragma GCC unroll 2
      for (int64_t off = 0; off < kRowBytes; off += 64)
        Prefetch(static_cast<const char*>(b) + k * kRowBytes + off + kPrefetchBytes);
    }
    V w[kNV];
    LoadPanelRow<T>(b, k, w);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const V av = Set1(a[r * lda + k]);
#pragma GCC unroll 4
      for (int i = 0; i < kNV; ++i) acc[r][i] = Fma(av, w[i], acc[r][i]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) StoreRow(out + r * ldo, acc[r], bias, col0, n);
}

using MicroFn = void (*)(const float*, int64_t, const void*, int64_t, float*, int64_t, int64_t, int64_t, bool,
                         const float*, bool);
template <ElemType T>
struct MicroTable {
#if defined(KVMESH_CPU_AVX512)
  static constexpr MicroFn kFns[kMR + 1] = {nullptr,         &Micro<T, 1>,  &Micro<T, 2>,  &Micro<T, 3>, &Micro<T, 4>,
                                            &Micro<T, 5>,    &Micro<T, 6>,  &Micro<T, 7>,  &Micro<T, 8>, &Micro<T, 9>,
                                            &Micro<T, 10>,   &Micro<T, 11>, &Micro<T, 12>};
#else
  static constexpr MicroFn kFns[kMR + 1] = {nullptr, &Micro<T, 1>, &Micro<T, 2>, &Micro<T, 3>};
#endif
};

template <ElemType T>
void Gemm(const LinearCtx& c, int64_t p_begin, int64_t p_end) {
  constexpr int64_t kElemBytes = T == ElemType::kBF16 ? 2 : 4;
  const int64_t mc = Max<int64_t>(kMR, (kABlockBytes / (c.k * 4)) / kMR * kMR);
  for (int64_t i0 = 0; i0 < c.m; i0 += mc) {
    const int64_t mb = Min(mc, c.m - i0);
    // Balanced row tiles: ceil(mb / kMR) tiles of (nearly) equal height.
    const int64_t tiles = (mb + kMR - 1) / kMR;
    for (int64_t p = p_begin; p < p_end; ++p) {
      const char* panel = c.panels + p * c.panel_bytes;
      for (int64_t k0 = 0; k0 < c.k; k0 += kKC) {
        const int64_t kc = Min(kKC, c.k - k0);
        const void* b = panel + k0 * kPanelCols * kElemBytes;
        const bool last = k0 + kc >= c.k;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r0 = mb * t / tiles;
          const int rows = static_cast<int>(mb * (t + 1) / tiles - r0);
          const int64_t row = i0 + r0;
          MicroTable<T>::kFns[rows](c.x + row * c.k + k0, c.k, b, kc, c.out + row * c.n, c.n, p * kPanelCols, c.n,
                                    k0 > 0, last ? c.bias : nullptr, t == 0);
        }
      }
    }
  }
}

template <ElemType T>
void LinearTyped(const LinearCtx& c, int num_threads) {
  const int64_t panels = (c.n + kPanelCols - 1) / kPanelCols;
  const bool gemv = c.m <= 8;
  // One parallel region; each thread owns a contiguous range of panels, so
  // threads never share an output element and no barrier is needed.
  const int64_t work = c.m * c.n * c.k;
  const int threads = work < (1 << 16) ? 1 : static_cast<int>(Min<int64_t>(num_threads, panels));
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    const int64_t p_begin = panels * tid / nt;
    const int64_t p_end = panels * (tid + 1) / nt;
    if (gemv) {
      Gemv<T>(c, p_begin, p_end);
    } else {
      Gemm<T>(c, p_begin, p_end);
    }
  }
}

}  // namespace

void Linear(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (m <= 0) return;
  const int64_t elem_bytes = w.type == ElemType::kBF16 ? 2 : 4;
  const LinearCtx c = {
      .x = x,
      .m = m,
      .k = w.k,
      .n = w.n,
      .panels = static_cast<const char*>(w.data),
      .panel_bytes = w.k * kPanelCols * elem_bytes,
      .bias = w.bias,
      .out = out,
  };
  if (w.type == ElemType::kBF16) {
    LinearTyped<ElemType::kBF16>(c, num_threads);
  } else {
    LinearTyped<ElemType::kF32>(c, num_threads);
  }
}

// The bf16 compute mode: x rounded to bf16 into a per-thread buffer, then the same FMA
// chain as Linear. A bf16 x bf16 product is exact in f32, so this is the bf16 dot
// product with f32 accumulation, and batch invariant for the reason Linear is. (AMX and
// VDPBF16PS have their own: amx_linear_kernel.cc, bf16_dot_linear_kernel.cc.)
void LinearBf16(const float* x, int64_t m, const PackedPanels& w, float* out, int num_threads) {
  if (m <= 0) return;
  thread_local std::vector<float> rounded;  // grow-only: no allocation per call once warm
  const int64_t total = m * w.k;
  if (static_cast<int64_t>(rounded.size()) < total) rounded.resize(static_cast<size_t>(total));
  float* xr = rounded.data();
  const int threads = total < (1 << 16) ? 1 : num_threads;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t row = 0; row < m; ++row) {
    const float* src = x + row * w.k;
    float* dst = xr + row * w.k;
    int64_t i = 0;
    for (; i + kLanes <= w.k; i += kLanes) Store(dst + i, RoundToBf16(Load(src + i)));
    if (i < w.k) StorePartial(dst + i, RoundToBf16(LoadPartial(src + i, static_cast<int>(w.k - i))), static_cast<int>(w.k - i));
  }
  Linear(xr, m, w, out, num_threads);
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
