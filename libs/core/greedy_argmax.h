// The greedy token of a row of logits, as the host sampler (engine/sampler.cc) and the
// CPU backend's ArgmaxRows (backend/ops.h) both read it: one algorithm for both.
#pragma once

#include <cstdint>
#include <limits>

namespace kvmesh {

// NaN never wins (-inf); +inf becomes the largest finite float so that exp(s - s_max)
// stays defined. Branch-free: loops over it vectorise.
inline float SanitizeLogit(float x) {
  constexpr float kMaxFloat = std::numeric_limits<float>::max();
  const float finite_top = x > kMaxFloat ? kMaxFloat : x;
  return x != x ? -std::numeric_limits<float>::infinity() : finite_top;
}

// The lowest i among the highest values of f(l[i]), i < v, or -1 when every value is
// -inf. Two passes (the max, then its first index) so the first is a branch-free
// reduction over independent lanes: one compare-and-keep chain over the vocabulary ran
// ~3 cycles per logit.
template <typename F>
int32_t GreedyArgmax(const float* l, int32_t v, F f) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int kLanes = 16;
  float lane_max[kLanes];
  for (float& m : lane_max) m = kNegInf;
  int32_t i = 0;
  for (; i + kLanes <= v; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float x = f(l[i + j]);
      lane_max[j] = x > lane_max[j] ? x : lane_max[j];
    }
  }
  float best = kNegInf;
  for (; i < v; ++i) best = f(l[i]) > best ? f(l[i]) : best;
  for (float m : lane_max) best = m > best ? m : best;
  if (!(best > kNegInf)) return -1;
  int32_t first = 0;
  while (f(l[first]) != best) ++first;
  return first;
}

// GreedyArgmax over the sanitized logits.
inline int32_t GreedyToken(const float* logits, int32_t v) {
  return GreedyArgmax(logits, v, [](float x) { return SanitizeLogit(x); });
}

}  // namespace kvmesh
