// vec.h: the one SIMD abstraction the CPU kernels are written against.
//
// The kernel sources are compiled twice, once with KVMESH_CPU_AVX512 and the
// AVX-512 flags, once with KVMESH_CPU_AVX2 and the AVX2+FMA flags. Everything
// here lives in namespace kvmesh::backend::cpu::KVMESH_CPU_ISA (avx512 or avx2),
// so the two builds never share a symbol and no AVX-512 instruction can reach
// code that runs on an AVX2-only CPU.
//
// NOTE: files including this header must not instantiate inline functions or
// templates shared with ISA-neutral code (std::vector, std::min, Abseil ...):
// the linker may keep the AVX-512 copy for everyone. Use the helpers below.
#pragma once

#include <immintrin.h>

#include <cstdint>

#if defined(KVMESH_CPU_AVX512)
#define KVMESH_CPU_ISA avx512
#elif defined(KVMESH_CPU_AVX2)
#define KVMESH_CPU_ISA avx2
#else
#error "vec.h needs KVMESH_CPU_AVX512 or KVMESH_CPU_AVX2"
#endif

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {

#define KVMESH_VEC_INLINE inline __attribute__((always_inline))

template <typename T>
KVMESH_VEC_INLINE constexpr T Min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
KVMESH_VEC_INLINE constexpr T Max(T a, T b) {
  return a < b ? b : a;
}

KVMESH_VEC_INLINE void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// Into L2 only: for many scattered lines in flight at once (L1's miss buffers are few).
KVMESH_VEC_INLINE void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

#if defined(KVMESH_CPU_AVX512)

inline constexpr int kLanes = 16;
struct V {
  __m512 v;
};
struct VI {
  __m512i v;
};

KVMESH_VEC_INLINE V Zero() { return {_mm512_setzero_ps()}; }
KVMESH_VEC_INLINE V Set1(float x) { return {_mm512_set1_ps(x)}; }
KVMESH_VEC_INLINE V Load(const float* p) { return {_mm512_loadu_ps(p)}; }
KVMESH_VEC_INLINE void Store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
KVMESH_VEC_INLINE __mmask16 TailMask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
// Loads/stores the first n (0 < n <= kLanes) lanes; the others read as 0.
KVMESH_VEC_INLINE V LoadPartial(const float* p, int n) { return {_mm512_maskz_loadu_ps(TailMask(n), p)}; }
KVMESH_VEC_INLINE void StorePartial(float* p, V a, int n) { _mm512_mask_storeu_ps(p, TailMask(n), a.v); }
KVMESH_VEC_INLINE V Fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
KVMESH_VEC_INLINE V Add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Max(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Min(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE float ReduceAdd(V a) { return _mm512_reduce_add_ps(a.v); }
KVMESH_VEC_INLINE float ReduceMax(V a) { return _mm512_reduce_max_ps(a.v); }
// Lanes where a < b (as all-ones) selects `y`, else `x`.
KVMESH_VEC_INLINE V SelectLess(V a, V b, V x, V y) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), x.v, y.v)};
}
KVMESH_VEC_INLINE V RoundNearest(V a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
KVMESH_VEC_INLINE V Pow2Int(V n) {  // 2^n for integral n in [-126, 127]
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// kLanes contiguous bf16 / f16 values widened to f32.
// One shuffle (vpermw, zero-masked: each value to the high half of its lane) instead of
// a zero-extension and a shift: one vector ALU op where the other takes two.
KVMESH_VEC_INLINE V LoadBf16(const uint16_t* p) {
  const __m512i w = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i to_high = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4,
                                           0, 3, 0, 2, 0, 1, 0, 0, 0);
  return {_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, to_high, w))};
}
KVMESH_VEC_INLINE V LoadF16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// kLanes dwords (2 * kLanes bf16): the low halves widened, and the high halves.
KVMESH_VEC_INLINE VI LoadI(const uint16_t* p) { return {_mm512_load_si512(p)}; }
KVMESH_VEC_INLINE VI LoadIu(const uint16_t* p) { return {_mm512_loadu_si512(p)}; }
KVMESH_VEC_INLINE V Bf16Low(VI w) { return {_mm512_castsi512_ps(_mm512_slli_epi32(w.v, 16))}; }
// 2 * kLanes floats in order from the even-indexed ones and the odd-indexed ones
// (what Bf16Low and Bf16High of one pair load give): p[2i] = even[i], p[2i+1] = odd[i].
KVMESH_VEC_INLINE void StoreInterleaved(float* p, V even, V odd) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_ps(p, _mm512_permutex2var_ps(even.v, lo, odd.v));
  _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(even.v, hi, odd.v));
}
KVMESH_VEC_INLINE V Bf16High(VI w) {
  return {_mm512_castsi512_ps(_mm512_and_si512(w.v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}
// Each lane rounded to the nearest bf16 (ties to even), kept as f32 (low 16 bits zero).
// Finite inputs (activations); a value within half a bf16 ulp of FLT_MAX becomes inf.
KVMESH_VEC_INLINE V RoundToBf16(V a) {
  const __m512i bits = _mm512_castps_si512(a.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return {_mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

#else  // AVX2

inline constexpr int kLanes = 8;
struct V {
  __m256 v;
};
struct VI {
  __m256i v;
};

KVMESH_VEC_INLINE V Zero() { return {_mm256_setzero_ps()}; }
KVMESH_VEC_INLINE V Set1(float x) { return {_mm256_set1_ps(x)}; }
KVMESH_VEC_INLINE V Load(const float* p) { return {_mm256_loadu_ps(p)}; }
KVMESH_VEC_INLINE void Store(float* p, V a) { _mm256_storeu_ps(p, a.v); }
KVMESH_VEC_INLINE __m256i TailMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
KVMESH_VEC_INLINE V LoadPartial(const float* p, int n) { return {_mm256_maskload_ps(p, TailMask(n))}; }
KVMESH_VEC_INLINE void StorePartial(float* p, V a, int n) { _mm256_maskstore_ps(p, TailMask(n), a.v); }
KVMESH_VEC_INLINE V Fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
KVMESH_VEC_INLINE V Add(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Sub(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Mul(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Div(V a, V b) { return {_mm256_div_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Max(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE V Min(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
KVMESH_VEC_INLINE float ReduceAdd(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
KVMESH_VEC_INLINE float ReduceMax(V a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
KVMESH_VEC_INLINE V SelectLess(V a, V b, V x, V y) {
  return {_mm256_blendv_ps(x.v, y.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))};
}
KVMESH_VEC_INLINE V RoundNearest(V a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
KVMESH_VEC_INLINE V Pow2Int(V n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}
KVMESH_VEC_INLINE V LoadBf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
KVMESH_VEC_INLINE V LoadF16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
KVMESH_VEC_INLINE VI LoadI(const uint16_t* p) { return {_mm256_load_si256(reinterpret_cast<const __m256i*>(p))}; }
KVMESH_VEC_INLINE VI LoadIu(const uint16_t* p) { return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))}; }
KVMESH_VEC_INLINE V Bf16Low(VI w) { return {_mm256_castsi256_ps(_mm256_slli_epi32(w.v, 16))}; }
KVMESH_VEC_INLINE void StoreInterleaved(float* p, V even, V odd) {  // as the AVX-512 one
  const __m256 lo = _mm256_unpacklo_ps(even.v, odd.v);  // e0 o0 e1 o1 | e4 o4 e5 o5
  const __m256 hi = _mm256_unpackhi_ps(even.v, odd.v);  // e2 o2 e3 o3 | e6 o6 e7 o7
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
KVMESH_VEC_INLINE V Bf16High(VI w) {
  return {_mm256_castsi256_ps(_mm256_and_si256(w.v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
}
KVMESH_VEC_INLINE V RoundToBf16(V a) {  // as the AVX-512 one
  const __m256i bits = _mm256_castps_si256(a.v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return {_mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
}

#endif

// e^x, |relative error| < 2 ulp on [-87, 88]; 0 below -87.3, +inf-free (clamped) above 88.7.
KVMESH_VEC_INLINE V Exp(V x) {
  const V lo = Set1(-87.33654f);
  const V xc = Min(Max(x, lo), Set1(88.72283f));
  const V n = RoundNearest(Mul(xc, Set1(1.44269504088896341f)));
  // r = x - n * ln2 in two steps (Cody-Waite).
  V r = Fma(n, Set1(-0.693359375f), xc);
  r = Fma(n, Set1(2.12194440e-4f), r);
  V p = Set1(1.9875691500e-4f);
  p = Fma(p, r, Set1(1.3981999507e-3f));
  p = Fma(p, r, Set1(8.3334519073e-3f));
  p = Fma(p, r, Set1(4.1665795894e-2f));
  p = Fma(p, r, Set1(1.6666665459e-1f));
  p = Fma(p, r, Set1(5.0000001201e-1f));
  p = Fma(p, Mul(r, r), Add(r, Set1(1.0f)));
  // 2^n: n in [-126, 128]; split n = 128 as 2 * 2^127 is not needed after clamping
  // (88.72 * log2e rounds to 128), so scale in two halves.
  const V half_n = RoundNearest(Mul(n, Set1(0.5f)));
  const V res = Mul(Mul(p, Pow2Int(half_n)), Pow2Int(Sub(n, half_n)));
  return SelectLess(x, lo, res, Zero());
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
