// Causal grouped-query attention over a dense f32 KV cache; compiled once per
// ISA (vec.h).
//
// Work item = (token, KV head): the item's whole query group (H / Hkv heads)
// is processed together, so each K and V row of that KV head is read once per
// token rather than once per query head. Keys are taken in blocks of kBlock
// positions with an online (flash) softmax: scores of the block, one rescale
// of the running sum and accumulator per block, then the V accumulation.
// Items are spread over threads dynamically (causal rows differ in length).
#include <omp.h>

#include <cstdint>

#include "backend/cpu/kernels_isa.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {
namespace {

constexpr int kBlock = 32;            // key positions per online-softmax step
constexpr int kMaxGroup = 16;         // query heads processed per pass over K/V
constexpr int64_t kMaxHeadDim = 512;  // accumulator width per head

KVMESH_VEC_INLINE float Dot(const float* a, const float* b, int64_t d) {
  V s0 = Zero();
  V s1 = Zero();
  int64_t c = 0;
  for (; c + 2 * kLanes <= d; c += 2 * kLanes) {
    s0 = Fma(Load(a + c), Load(b + c), s0);
    s1 = Fma(Load(a + c + kLanes), Load(b + c + kLanes), s1);
  }
  for (; c < d; c += kLanes) {
    const int n = static_cast<int>(Min<int64_t>(kLanes, d - c));
    s0 = Fma(LoadPartial(a + c, n), LoadPartial(b + c, n), s0);
  }
  return ReduceAdd(Add(s0, s1));
}

// acc[c] = acc[c] * scale + p * v[c] for c < d.
KVMESH_VEC_INLINE void Axpy(float* acc, float p, const float* v, int64_t d) {
  const V pv = Set1(p);
  int64_t c = 0;
  for (; c + kLanes <= d; c += kLanes) Store(acc + c, Fma(pv, Load(v + c), Load(acc + c)));
  if (c < d) {
    const int n = static_cast<int>(d - c);
    StorePartial(acc + c, Fma(pv, LoadPartial(v + c, n), LoadPartial(acc + c, n)), n);
  }
}

KVMESH_VEC_INLINE void Scale(float* acc, float s, int64_t d) {
  const V sv = Set1(s);
  int64_t c = 0;
  for (; c + kLanes <= d; c += kLanes) Store(acc + c, Mul(Load(acc + c), sv));
  for (; c < d; ++c) acc[c] *= s;
}

KVMESH_VEC_INLINE float ExpScalar(float x) {
  float in[kLanes] = {};
  in[0] = x;
  float out[kLanes];
  Store(out, Exp(Load(in)));
  return out[0];
}

// One token, query heads [h0, h0 + g) sharing KV head `kvh`, head_dim d <= kMaxHeadDim.
void AttendGroup(const float* q, const float* k, const float* v, int64_t hkv, int64_t d, int64_t kvh, int g,
                 int64_t len, float scale, float* out) {
  alignas(64) float acc[kMaxGroup][kMaxHeadDim];
  alignas(64) float scores[kMaxGroup][kBlock];
  float running_max[kMaxGroup];
  float running_sum[kMaxGroup];
  for (int j = 0; j < g; ++j) {
    running_max[j] = -__builtin_inff();
    running_sum[j] = 0.0f;
    for (int64_t c = 0; c < d; ++c) acc[j][c] = 0.0f;
  }
  const int64_t row_stride = hkv * d;
  for (int64_t s0 = 0; s0 < len; s0 += kBlock) {
    const int bs = static_cast<int>(Min<int64_t>(kBlock, len - s0));
    for (int s = 0; s < bs; ++s) {
      const float* krow = k + (s0 + s) * row_stride + kvh * d;
      for (int j = 0; j < g; ++j) scores[j][s] = Dot(q + j * d, krow, d) * scale;
    }
    for (int j = 0; j < g; ++j) {
      float block_max = scores[j][0];
      for (int s = 1; s < bs; ++s) block_max = Max(block_max, scores[j][s]);
      const float new_max = Max(running_max[j], block_max);
      // exp of the block's scores, vectorised.
      float sum = 0.0f;
      for (int s = 0; s < bs; s += kLanes) {
        const int n = Min(kLanes, bs - s);
        const V e = Exp(Sub(LoadPartial(&scores[j][s], n), Set1(new_max)));
        StorePartial(&scores[j][s], e, n);
        sum += ReduceAdd(n == kLanes ? e : LoadPartial(&scores[j][s], n));
      }
      if (running_max[j] != new_max) {
        const float correction = ExpScalar(running_max[j] - new_max);
        running_sum[j] *= correction;
        Scale(acc[j], correction, d);
        running_max[j] = new_max;
      }
      running_sum[j] += sum;
    }
    for (int s = 0; s < bs; ++s) {
      const float* vrow = v + (s0 + s) * row_stride + kvh * d;
      for (int j = 0; j < g; ++j) Axpy(acc[j], scores[j][s], vrow, d);
    }
  }
  for (int j = 0; j < g; ++j) {
    const float inv = 1.0f / running_sum[j];
    float* o = out + j * d;
    int64_t c = 0;
    for (; c + kLanes <= d; c += kLanes) Store(o + c, Mul(Load(acc[j] + c), Set1(inv)));
    for (; c < d; ++c) o[c] = acc[j][c] * inv;
  }
}

}  // namespace

void DenseAttention(const float* q, const float* k, const float* v, int64_t t, int64_t h, int64_t hkv, int64_t d,
                    const int32_t* positions, float scale, float* out, int num_threads) {
  const int64_t group = h / hkv;
  const int64_t chunks_per_group = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t items = t * hkv * chunks_per_group;
  // Keys touched ~ sum of lengths; a lone short decode query stays on this thread.
  const int64_t work = items * (positions[t - 1] + 1) * d;
  const int threads = work < (1 << 14) ? 1 : num_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t tok = item / (hkv * chunks_per_group);
    const int64_t rest = item % (hkv * chunks_per_group);
    const int64_t kvh = rest / chunks_per_group;
    const int64_t h0 = kvh * group + (rest % chunks_per_group) * kMaxGroup;
    const int g = static_cast<int>(Min<int64_t>(kMaxGroup, kvh * group + group - h0));
    const int64_t len = static_cast<int64_t>(positions[tok]) + 1;
    AttendGroup(q + (tok * h + h0) * d, k, v, hkv, d, kvh, g, len, scale, out + (tok * h + h0) * d);
  }
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
