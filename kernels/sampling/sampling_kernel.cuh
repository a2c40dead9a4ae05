// The top-k / top-p sampling kernel (sampling.h: semantics and accuracy). Included by
// sampling.cu and by the host emulation test.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "sampling/philox.cuh"

namespace kvmesh::kernels::sampling {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
// Pivots per search pass: the candidate key range shrinks 16-fold per pass over the row,
// so a 32-bit key is pinned down in 8 passes.
inline constexpr int kPivots = 15;
inline constexpr float kGreedyTemperature = 1e-5f;  // engine::kGreedyTemperature (vLLM's _SAMPLING_EPS)

// The sampler's SanitizeLogit: NaN -> -inf, +inf -> the largest finite float; and -0 -> +0
// so that equal logits get equal order keys.
__device__ __forceinline__ float Sanitize(float x) {
  if (x != x) return -INFINITY;
  return fminf(x, FLT_MAX) + 0.0f;
}

// A key whose unsigned order is the float order (for non-NaN floats), and back.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyToFloat(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}

// Unnormalised softmax(logits / T): exp((x - max) * (1 / T)) as the sampler computes it.
// Recomputed in each pass rather than stored: the same inputs give the same bits.
__device__ __forceinline__ float Weight(float x, float max_logit, float inv_t) { return expf((x - max_logit) * inv_t); }

// Shared memory of one row's CTA.
struct RowShared {
  double warp_pivot_sums[kWarps][kPivots];
  double pivot_totals[kPivots];
  double warp_doubles[kWarps];
  int64_t warp_ints[kWarps];
  float warp_best[kWarps];
  int32_t warp_best_id[kWarps];
  float best;
  int32_t best_id;
  // The search for a cut key: the answer lies in [lo, hi); F(hi) = f_hi < target.
  uint32_t lo;
  uint32_t hi;
  double f_hi;
  int32_t choice;
  int32_t last_survivor;
};

// The largest sanitized logit of the row and its lowest id (INT32_MAX with -inf when every
// logit is NaN or -inf), into s.best / s.best_id. Called by every thread.
__device__ inline void RowArgmax(const float* row, int64_t vocab, RowShared& s) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
  // Ids ascend within a thread, so a strict > keeps the lowest id of equal values.
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = Sanitize(row[i]);
    if (x > best) {
      best = x;
      best_id = static_cast<int32_t>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(kFullMask, best, o);
    const int32_t other_id = __shfl_xor_sync(kFullMask, best_id, o);
    if (other > best || (other == best && other_id < best_id)) {
      best = other;
      best_id = other_id;
    }
  }
  if (lane == 0) {
    s.warp_best[warp] = best;
    s.warp_best_id[warp] = best_id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (s.warp_best[w] > best || (s.warp_best[w] == best && s.warp_best_id[w] < best_id)) {
        best = s.warp_best[w];
        best_id = s.warp_best_id[w];
      }
    }
    s.best = best;
    s.best_id = best_id;
  }
  __syncthreads();
}

// Exclusive prefix sum over the threads in thread order, and the block's total (the same
// bits in every thread: each sums the warp totals in one fixed order). Called by every thread.
template <typename T>
__device__ T BlockExclusiveSum(T v, T* warp_totals, T* block_total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  T inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T before = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += before;
  }
  T exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
  if (lane == 0) exclusive = T{0};
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  T before_warp = T{0};
  T total = T{0};
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before_warp += warp_totals[w];
    total += warp_totals[w];
  }
  __syncthreads();  // warp_totals may be reused by the next call
  *block_total = total;
  return before_warp + exclusive;
}

// Finds the largest key t in [s.lo, s.hi) with F(t) >= target, where F(t) is the sum of
// contribution(x) over the row's tokens with key >= t, given F(s.lo) >= target and
// F(s.hi) = s.f_hi < target. Each pass evaluates F at 15 pivots spread over the range and
// keeps the sub-range between the last pivot that reaches the target and the first after
// it that does not. Leaves the answer in s.lo and F(s.lo + 1) in s.f_hi. Called by every
// thread. Acc: each thread's partial sums (int32 for counts: exact; f32 for weights: 250
// terms at vocab 128k, ~1e-6 relative, reduced across threads in f64).
template <typename Acc, typename Contribution>
__device__ void SearchCut(const float* row, int64_t vocab, double target, Contribution contribution, RowShared& s) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  while (true) {
    const uint32_t lo = s.lo;
    const uint32_t hi = s.hi;
    if (hi <= lo + 1) break;  // uniform: every thread read the same shared values
    const uint64_t span = hi - lo;
    uint32_t pivot[kPivots];  // in (lo, hi], ascending; hi < 2^32 so none wraps
#pragma unroll
    for (int j = 0; j < kPivots; ++j) pivot[j] = lo + static_cast<uint32_t>((span * (j + 1) + kPivots) / (kPivots + 1));
    Acc acc[kPivots];
#pragma unroll
    for (int j = 0; j < kPivots; ++j) acc[j] = Acc{0};
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = Sanitize(row[i]);
      const uint32_t key = OrderKey(x);
      if (key <= lo) continue;  // below every pivot
      const Acc c = contribution(x);
#pragma unroll
      for (int j = 0; j < kPivots; ++j) acc[j] += key >= pivot[j] ? c : Acc{0};
    }
#pragma unroll
    for (int j = 0; j < kPivots; ++j) {
      double v = static_cast<double>(acc[j]);
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
      if (lane == 0) s.warp_pivot_sums[warp][j] = v;
    }
    __syncthreads();  // every thread has read s.lo / s.hi above; sums are in place
    if (threadIdx.x < kPivots) {
      double total = 0.0;
      for (int w = 0; w < kWarps; ++w) total += s.warp_pivot_sums[w][threadIdx.x];
      s.pivot_totals[threadIdx.x] = total;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t new_lo = lo;
      for (int j = 0; j < kPivots; ++j) {
        if (s.pivot_totals[j] >= target && pivot[j] > new_lo) new_lo = pivot[j];
      }
      uint32_t new_hi = hi;
      double f_hi = s.f_hi;
      for (int j = 0; j < kPivots; ++j) {
        if (pivot[j] > new_lo && pivot[j] < new_hi && !(s.pivot_totals[j] >= target)) {
          new_hi = pivot[j];
          f_hi = s.pivot_totals[j];
        }
      }
      s.lo = new_lo;
      s.hi = new_hi;
      s.f_hi = f_hi;
    }
    __syncthreads();
  }
}

// One CTA per row. Every branch that returns early is uniform across the CTA (it depends
// on shared or per-row values only), so no barrier is skipped by some threads.
__global__ void __launch_bounds__(kThreads, 1)
    SampleTopKTopPKernel(const float* __restrict__ logits, int64_t vocab, const float* __restrict__ temperature,
                         const int32_t* __restrict__ top_k, const float* __restrict__ top_p,
                         const uint64_t* __restrict__ seeds, const uint64_t* __restrict__ offsets,
                         int32_t* __restrict__ out_ids) {
  __shared__ RowShared s;
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;

  // 1. The max logit (every path needs it) and its lowest id (the greedy answer).
  RowArgmax(row, vocab, s);
  const float max_logit = s.best;
  const int32_t argmax = s.best_id;
  if (!(max_logit > -INFINITY)) {
    if (threadIdx.x == 0) out_ids[r] = -1;
    return;
  }
  const float t = temperature[r];
  if (!(t >= kGreedyTemperature)) {
    if (threadIdx.x == 0) out_ids[r] = argmax;
    return;
  }
  const float inv_t = 1.0f / t;
  const auto weight = [=](float x) { return Weight(x, max_logit, inv_t); };

  // 2. top-k: kappa = the k-th highest key; the need_k lowest ids among tokens at kappa
  //    survive with every token above it.
  const int32_t k = top_k[r];
  const bool use_top_k = k > 0 && k < vocab;
  uint32_t kappa = 0;  // below every key a token can have (-inf's is 0x007fffff)
  int64_t need_k = 0;
  // No token's key exceeds the max logit's: F(max_key + 1) = 0 bounds both searches, and
  // max_key + 1 <= OrderKey(FLT_MAX) + 1 < 2^32 keeps keys and pivots in 32 bits.
  const uint32_t key_end = OrderKey(max_logit) + 1;
  if (use_top_k) {
    if (threadIdx.x == 0) {
      s.lo = 0;
      s.hi = key_end;
      s.f_hi = 0.0;
    }
    __syncthreads();
    SearchCut<int32_t>(row, vocab, static_cast<double>(k), [](float) { return int32_t{1}; }, s);
    kappa = s.lo;
    need_k = k - static_cast<int64_t>(s.f_hi);
    __syncthreads();  // everyone has read s before step 3 rewrites it
  }

  // 3. top-p over the top-k survivors: v = the largest key whose survivors at or above it
  //    hold >= p x their total; every survivor above v is kept, and the lowest-id tokens at
  //    v until the mass before the next reaches the threshold.
  uint32_t cut = kappa;
  int64_t n_tie = need_k;
  const float p = top_p[r];
  if (p < 1.0f) {
    float above_kappa = 0.0f;  // this thread's partial sum (see SearchCut's Acc)
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = Sanitize(row[i]);
      if (OrderKey(x) > kappa) above_kappa += weight(x);
    }
    double total = 0.0;
    BlockExclusiveSum(static_cast<double>(above_kappa), s.warp_doubles, &total);
    if (use_top_k) total += static_cast<double>(need_k) * static_cast<double>(weight(KeyToFloat(kappa)));
    double threshold = static_cast<double>(p) * total;
    if (!(threshold > 0.0)) threshold = DBL_MIN;  // p <= 0: the top token alone
    if (threadIdx.x == 0) {
      s.lo = kappa;
      s.hi = key_end;
      s.f_hi = 0.0;
    }
    __syncthreads();
    // Only keys above s.lo >= kappa reach the contribution: all are top-k survivors.
    SearchCut<float>(row, vocab, threshold, weight, s);
    cut = s.lo;
    const double above_cut = s.f_hi;
    const double w_cut = static_cast<double>(weight(KeyToFloat(cut)));
    double ties = w_cut > 0.0 ? ceil((threshold - above_cut) / w_cut) : 1.0;
    if (!(ties >= 1.0)) ties = 1.0;
    if (ties > 2147483647.0) ties = 2147483647.0;
    n_tie = static_cast<int64_t>(ties);
    if (use_top_k && cut == kappa && n_tie > need_k) n_tie = need_k;
  }

  // 4. The draw: survivors are the tokens with key > cut and the first n_tie (in id order)
  //    with key == cut. Each thread takes a contiguous id range so prefix sums run in id
  //    order: tie ranks first, then survivor mass, then the thread whose range holds
  //    u x total walks it.
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t begin = min(vocab, static_cast<int64_t>(threadIdx.x) * chunk);
  const int64_t end = min(vocab, begin + chunk);
  int64_t my_ties = 0;
  if (n_tie > 0) {
    for (int64_t i = begin; i < end; ++i) my_ties += OrderKey(Sanitize(row[i])) == cut ? 1 : 0;
  }
  int64_t all_ties = 0;
  const int64_t ties_before = BlockExclusiveSum(my_ties, s.warp_ints, &all_ties);
  const auto survives = [&](uint32_t key, int64_t& rank) {
    if (key > cut) return true;
    if (key != cut) return false;
    return rank++ < n_tie;
  };
  double my_mass = 0.0;
  int32_t my_last = -1;
  {
    int64_t rank = ties_before;
    for (int64_t i = begin; i < end; ++i) {
      const float x = Sanitize(row[i]);
      if (!survives(OrderKey(x), rank)) continue;
      const float w = weight(x);
      if (w > 0.0f) {
        my_mass += static_cast<double>(w);
        my_last = static_cast<int32_t>(i);
      }
    }
  }
  if (threadIdx.x == 0) {
    s.choice = INT32_MAX;
    s.last_survivor = -1;
  }
  double total = 0.0;
  const double mass_before = BlockExclusiveSum(my_mass, s.warp_doubles, &total);  // its barriers publish s.choice
  const double target = PhiloxUniform(seeds[r], offsets[r]) * total;
  if (my_last >= 0) atomicMax(&s.last_survivor, my_last);
  if (my_mass > 0.0 && mass_before <= target && target < mass_before + my_mass) {
    int64_t rank = ties_before;
    double cumulative = mass_before;
    int32_t pick = my_last;  // if rounding leaves the target past this range's last token
    for (int64_t i = begin; i < end; ++i) {
      const float x = Sanitize(row[i]);
      if (!survives(OrderKey(x), rank)) continue;
      const float w = weight(x);
      if (!(w > 0.0f)) continue;
      cumulative += static_cast<double>(w);
      if (target < cumulative) {
        pick = static_cast<int32_t>(i);
        break;
      }
    }
    atomicMin(&s.choice, pick);  // NOTE: two claimants only through rounding; the lower id wins
  }
  __syncthreads();
  if (threadIdx.x == 0) out_ids[r] = s.choice != INT32_MAX ? s.choice : s.last_survivor;
}

// The launch's grid: one CTA per row.
inline dim3 SampleTopKTopPGrid(int64_t num_rows) { return dim3(static_cast<unsigned>(num_rows)); }

}  // namespace kvmesh::kernels::sampling
