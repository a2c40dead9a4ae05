// The host oracle of the top-k / top-p sampling kernel (sampling_test on the GPU, the host
// emulation test without one): engine::SequenceSampler's semantics (libs/engine/sampler.cc)
// written out plainly — greedy argmax (lowest id on ties), top-k then top-p over the top-k
// survivors, one inverse-CDF draw over the survivors in id order at the row's Philox uniform.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "sampling/philox.cuh"

namespace kvmesh::kernels::test_util {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

struct RowParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// The launcher's per-row arrays (host copies) for `params`, one entry per row.
struct RowArrays {
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seeds, offsets;
};

inline RowArrays SplitRowParams(const std::vector<RowParams>& params) {
  RowArrays a;
  for (const RowParams& p : params) {
    a.temperature.push_back(p.temperature);
    a.top_k.push_back(p.top_k);
    a.top_p.push_back(p.top_p);
    a.seeds.push_back(p.seed);
    a.offsets.push_back(p.offset);
  }
  return a;
}

inline float Sanitize(float x) { return std::isnan(x) ? -kInf : std::min(x, FLT_MAX); }

// The survivors of top-k then top-p for one row, as SequenceSampler::SampleRandom picks
// them, in id order, with their weights exp((x - max) / T) (f32, as the kernel computes).
struct Survivors {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

inline Survivors HostSurvivors(const float* logits, int64_t vocab, const RowParams& p) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) l[static_cast<size_t>(i)] = Sanitize(logits[i]);
  const float max_logit = *std::max_element(l.begin(), l.end());
  const float inv_t = 1.0f / p.temperature;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
           (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
  });
  const auto weight = [&](int32_t id) {
    return static_cast<double>(std::exp((l[static_cast<size_t>(id)] - max_logit) * inv_t));
  };
  size_t n = p.top_k > 0 && p.top_k < vocab ? static_cast<size_t>(p.top_k) : order.size();
  if (p.top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += weight(order[i]);
    const double threshold = static_cast<double>(p.top_p) * total;
    size_t nucleus = 0;
    double before = 0;
    while (nucleus < n && before < threshold) before += weight(order[nucleus++]);
    n = nucleus;
  }
  order.resize(n);
  std::sort(order.begin(), order.end());
  Survivors s;
  for (int32_t id : order) {
    if (weight(id) > 0) {
      s.ids.push_back(id);
      s.weights.push_back(weight(id));
    }
  }
  return s;
}

// The token the kernel should draw: inverse CDF over the survivors in id order at the
// row's Philox uniform.
inline int32_t HostDraw(const Survivors& s, const RowParams& p) {
  const double total = std::accumulate(s.weights.begin(), s.weights.end(), 0.0);
  const double target = PhiloxUniform(p.seed, p.offset) * total;
  double cumulative = 0;
  for (size_t i = 0; i < s.ids.size(); ++i) {
    cumulative += s.weights[i];
    if (target < cumulative) return s.ids[i];
  }
  return s.ids.back();
}

inline std::vector<float> RandomLogits(int64_t rows, int64_t vocab, float spread, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = normal(rng);
  return logits;
}

inline int32_t HostArgmax(const float* l, int64_t vocab) {
  int32_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (Sanitize(l[i]) > Sanitize(l[best])) best = static_cast<int32_t>(i);
  }
  return best;
}

inline constexpr int64_t kGreedyEdgeRows = 8;

// kGreedyEdgeRows random rows of `vocab` (>= 64) logits, edited: row 1 all equal (id 0
// wins); row 2 the max twice, late (the first of the two, vocab - 5); row 3 NaN everywhere
// but ids 17 and vocab / 8, the larger; row 4 two +inf at vocab * 31 / 32 and vocab * 5 / 8
// (the lower id wins) and a NaN; row 5 nothing finite (-1); row 6 the max at the last id.
inline std::vector<float> GreedyEdgeRows(int64_t vocab, std::mt19937& rng) {
  std::vector<float> logits = RandomLogits(kGreedyEdgeRows, vocab, 3.0f, rng);
  float* row = logits.data();
  std::fill(row + vocab, row + 2 * vocab, 0.25f);
  row[2 * vocab + vocab - 5] = 100.0f;
  row[2 * vocab + vocab - 2] = 100.0f;
  std::fill(row + 3 * vocab, row + 4 * vocab, kNaN);
  row[3 * vocab + 17] = -3.0f;
  row[3 * vocab + vocab / 8] = -2.0f;
  row[4 * vocab + 9] = kNaN;
  row[4 * vocab + vocab * 31 / 32] = kInf;
  row[4 * vocab + vocab * 5 / 8] = kInf;
  std::fill(row + 5 * vocab, row + 6 * vocab, kNaN);
  row[5 * vocab + 3] = -kInf;
  row[6 * vocab + vocab - 1] = 1000.0f;
  return logits;
}

// Greedy rows' parameters: temperature 0 or just under the greedy threshold, with top-k and
// top-p set (greedy ignores them).
inline std::vector<RowParams> GreedyRowParams() {
  std::vector<RowParams> params(kGreedyEdgeRows);
  for (size_t r = 0; r < params.size(); ++r) {
    params[r] = {.temperature = r % 2 == 0 ? 0.0f : 5e-6f, .top_k = static_cast<int32_t>(r) * 3, .top_p = 0.5f,
                 .seed = r};
  }
  return params;
}

// The kernel's ids `got` for GreedyEdgeRows(vocab).
inline void ExpectGreedyEdgeRows(const std::vector<float>& logits, int64_t vocab, const std::vector<int32_t>& got) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kGreedyEdgeRows));
  for (int64_t r = 0; r < kGreedyEdgeRows; ++r) {
    const int32_t expected = r == 5 ? -1 : HostArgmax(logits.data() + r * vocab, vocab);
    EXPECT_EQ(got[static_cast<size_t>(r)], expected) << "row " << r;
  }
  EXPECT_EQ(got[1], 0);
  EXPECT_EQ(got[2], vocab - 5);
  EXPECT_EQ(got[3], vocab / 8);
  EXPECT_EQ(got[4], vocab * 5 / 8);
  EXPECT_EQ(got[6], vocab - 1);
}

}  // namespace kvmesh::kernels::test_util
