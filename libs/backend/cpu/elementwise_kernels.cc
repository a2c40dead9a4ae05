// Row-wise kernels (embedding, RMSNorm, RoPE, SiLU-and-mul); compiled once per
// ISA (vec.h). Each parallelises over rows only when there is enough work to
// pay for waking the OpenMP team (~1 us), so a decode step's tiny ops run on
// the calling thread.
#include <math.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels_isa.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {
namespace {

constexpr int64_t kMinParallelElements = 1 << 15;

int ThreadsFor(int64_t elements, int num_threads) { return elements < kMinParallelElements ? 1 : num_threads; }

// Loads n (1..kLanes) elements of type `type` at p + i, widened; lanes past n are 0.
KVMESH_VEC_INLINE V LoadAny(const void* p, ElemType type, int64_t i, int n) {
  if (type == ElemType::kF32) {
    const float* f = static_cast<const float*>(p) + i;
    return n == kLanes ? Load(f) : LoadPartial(f, n);
  }
  const uint16_t* h = static_cast<const uint16_t*>(p) + i;
  uint16_t tmp[kLanes];
  if (n < kLanes) {
    for (int j = 0; j < kLanes; ++j) tmp[j] = j < n ? h[j] : 0;
    h = tmp;
  }
  return type == ElemType::kBF16 ? LoadBf16(h) : LoadF16(h);
}

KVMESH_VEC_INLINE void StoreN(float* p, V v, int n) {
  if (n == kLanes) {
    Store(p, v);
  } else {
    StorePartial(p, v, n);
  }
}

}  // namespace

void Embedding(const int32_t* ids, int64_t t, const void* table, ElemType type, int64_t row_stride, int64_t e,
               float* out, int num_threads) {
  const int64_t elem_bytes = type == ElemType::kF32 ? 4 : 2;
#pragma omp parallel for num_threads(ThreadsFor(t* e, num_threads))
  for (int64_t r = 0; r < t; ++r) {
    const void* row = static_cast<const char*>(table) + ids[r] * row_stride * elem_bytes;
    float* o = out + r * e;
    for (int64_t c = 0; c < e; c += kLanes) {
      const int n = static_cast<int>(Min<int64_t>(kLanes, e - c));
      StoreN(o + c, LoadAny(row, type, c, n), n);
    }
  }
}

void RmsNorm(float* residual, const float* x, int64_t t, int64_t e, const void* weight, ElemType weight_type, float eps,
             float* out, int num_threads) {
#pragma omp parallel for num_threads(ThreadsFor(t* e, num_threads))
  for (int64_t r = 0; r < t; ++r) {
    const float* in = x + r * e;
    if (residual != nullptr) {
      float* res = residual + r * e;
      for (int64_t c = 0; c < e; c += kLanes) {
        const int n = static_cast<int>(Min<int64_t>(kLanes, e - c));
        const V s =
            n == kLanes ? Add(Load(res + c), Load(in + c)) : Add(LoadPartial(res + c, n), LoadPartial(in + c, n));
        StoreN(res + c, s, n);
      }
      in = res;
    }
    V ss0 = Zero();
    V ss1 = Zero();
    int64_t c = 0;
    for (; c + 2 * kLanes <= e; c += 2 * kLanes) {
      const V a = Load(in + c);
      const V b = Load(in + c + kLanes);
      ss0 = Fma(a, a, ss0);
      ss1 = Fma(b, b, ss1);
    }
    for (; c < e; c += kLanes) {
      const V a = LoadPartial(in + c, static_cast<int>(Min<int64_t>(kLanes, e - c)));
      ss0 = Fma(a, a, ss0);
    }
    const float mean = ReduceAdd(Add(ss0, ss1)) / static_cast<float>(e);
    const V inv = Set1(1.0f / __builtin_sqrtf(mean + eps));
    float* o = out + r * e;
    for (c = 0; c < e; c += kLanes) {
      const int n = static_cast<int>(Min<int64_t>(kLanes, e - c));
      const V xv = n == kLanes ? Load(in + c) : LoadPartial(in + c, n);
      StoreN(o + c, Mul(Mul(xv, inv), LoadAny(weight, weight_type, c, n)), n);
    }
  }
}

void Rope(float* q, float* k, int64_t t, int64_t h, int64_t hkv, int64_t d, const int32_t* positions,
          const float* inv_freq, int num_threads) {
  const int64_t half = d / 2;
#pragma omp parallel for num_threads(ThreadsFor(t*(h + hkv) * d, num_threads))
  for (int64_t r = 0; r < t; ++r) {
    // NOTE: as transformers: angle = f32(position) * inv_freq rounded to f32,
    // then cos/sin of that f32 angle in f32 (glibc's are correctly rounded).
    constexpr int64_t kChunk = 256;
    float cos_v[kChunk];
    float sin_v[kChunk];
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i0 = 0; i0 < half; i0 += kChunk) {
      const int64_t len = Min(kChunk, half - i0);
      for (int64_t i = 0; i < len; ++i) {
        const float angle = pos * inv_freq[i0 + i];
        sincosf(angle, &sin_v[i], &cos_v[i]);
      }
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t heads = pass == 0 ? h : hkv;
        float* base = (pass == 0 ? q : k) + r * heads * d;
        for (int64_t hh = 0; hh < heads; ++hh) {
          float* x1p = base + hh * d + i0;
          float* x2p = x1p + half;
          for (int64_t i = 0; i < len; i += kLanes) {
            const int n = static_cast<int>(Min<int64_t>(kLanes, len - i));
            const V x1 = n == kLanes ? Load(x1p + i) : LoadPartial(x1p + i, n);
            const V x2 = n == kLanes ? Load(x2p + i) : LoadPartial(x2p + i, n);
            const V cv = n == kLanes ? Load(cos_v + i) : LoadPartial(cos_v + i, n);
            const V sv = n == kLanes ? Load(sin_v + i) : LoadPartial(sin_v + i, n);
            // q*cos + rotate_half(q)*sin, each product rounded as in PyTorch (no FMA).
            StoreN(x1p + i, Sub(Mul(x1, cv), Mul(x2, sv)), n);
            StoreN(x2p + i, Add(Mul(x2, cv), Mul(x1, sv)), n);
          }
        }
      }
    }
  }
}

void SiluAndMul(const float* gate_up, int64_t t, int64_t inter, float* out, int num_threads) {
#pragma omp parallel for num_threads(ThreadsFor(t* inter * 8, num_threads))
  for (int64_t r = 0; r < t; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    float* o = out + r * inter;
    for (int64_t i = 0; i < inter; i += kLanes) {
      const int n = static_cast<int>(Min<int64_t>(kLanes, inter - i));
      const V gv = n == kLanes ? Load(g + i) : LoadPartial(g + i, n);
      const V uv = n == kLanes ? Load(u + i) : LoadPartial(u + i, n);
      const V silu = Div(gv, Add(Set1(1.0f), Exp(Sub(Zero(), gv))));
      StoreN(o + i, Mul(silu, uv), n);
    }
  }
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
