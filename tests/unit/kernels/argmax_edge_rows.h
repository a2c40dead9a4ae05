// The argmax kernel tests' logits (argmax_test on the GPU, the host emulation test without
// one) and their oracle, the host sampler's greedy path (SequenceSampler at temperature 0).
#pragma once

#include <cfloat>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sampler.h"

namespace kvmesh::kernels::test_util {

inline constexpr int64_t kArgmaxEdgeRows = 9;

// kArgmaxEdgeRows rows of `vocab` random logits, edited: row 1 a tie between two maxima (the
// lower id wins), row 2 NaN everywhere but one, row 3 +inf and FLT_MAX tie, row 4 all NaN
// (-1), row 5 all equal, row 6 the maximum in the last element, row 7 -inf everywhere (-1),
// row 8 a NaN where the maximum would be. Row 0 stays random.
inline std::vector<float> ArgmaxEdgeRows(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 3.f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits(static_cast<size_t>(kArgmaxEdgeRows * vocab));
  for (float& x : logits) x = normal(rng);
  auto row = [&](int64_t r) { return logits.data() + r * vocab; };
  row(1)[vocab - 5] = 50.f;
  row(1)[vocab / 3] = 50.f;
  for (int64_t i = 0; i < vocab; ++i) row(2)[i] = nan;
  row(2)[vocab / 2] = -3.f;
  row(3)[vocab - 2] = inf;
  row(3)[7] = FLT_MAX;
  for (int64_t i = 0; i < vocab; ++i) row(4)[i] = nan;
  for (int64_t i = 0; i < vocab; ++i) row(5)[i] = 0.25f;
  row(6)[vocab - 1] = 99.f;
  for (int64_t i = 0; i < vocab; ++i) row(7)[i] = -inf;
  row(8)[11] = nan;
  return logits;
}

// The host sampler's greedy token for `row` (-1 where it finds no finite logit).
inline int32_t HostGreedy(const std::vector<float>& row) {
  engine::SamplingParams params;
  params.temperature = 0.0f;
  auto sampler = engine::SequenceSampler::Create(params, static_cast<int32_t>(row.size()), {}, {});
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  auto result = sampler->Sample(row);
  return result.ok() ? result->token_id : -1;
}

// Every row's argmax `got` against HostGreedy, and the rows whose answer is known.
inline void ExpectArgmaxEdgeRows(const std::vector<float>& logits, int64_t vocab, const std::vector<int32_t>& got) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kArgmaxEdgeRows));
  for (int64_t r = 0; r < kArgmaxEdgeRows; ++r) {
    const std::vector<float> host(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    EXPECT_EQ(got[static_cast<size_t>(r)], HostGreedy(host)) << "row " << r;
  }
  EXPECT_EQ(got[1], vocab / 3);
  EXPECT_EQ(got[3], 7);
  EXPECT_EQ(got[4], -1);
  EXPECT_EQ(got[5], 0);
}

}  // namespace kvmesh::kernels::test_util
