// The device argmax (kernels/argmax) against the host sampler's greedy path
// (SequenceSampler at temperature 0, no penalties), which it stands in for when the CUDA
// runner returns argmax tokens: the same token on every row, bit for bit the same rule —
// ties go to the lowest id, NaN never wins, +inf ties with FLT_MAX — and -1 where the
// sampler finds no finite logit. Vocabularies 32000, 128256 and an odd 1001 (the unaligned
// path). Skips where no GPU is present (CI), saying why.
#include "argmax/argmax.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "engine/sampler.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

int32_t HostGreedy(const std::vector<float>& row) {
  engine::SamplingParams params;
  params.temperature = 0.0f;
  auto sampler = engine::SequenceSampler::Create(params, static_cast<int32_t>(row.size()), {}, {});
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  auto result = sampler->Sample(row);
  return result.ok() ? result->token_id : -1;
}

TEST(ArgmaxKernelTest, MatchesTheHostSamplersGreedyToken) {
  KVMESH_SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.f, 3.f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t vocab : {32000, 128256, 1001}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const int64_t rows = 9;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& x : logits) x = normal(rng);
    auto row = [&](int64_t r) { return logits.data() + r * vocab; };
    // Row 1: a tie between two maxima (the lower id wins). Row 2: NaN everywhere but one.
    // Row 3: +inf and FLT_MAX tie. Row 4: all NaN (-1). Row 5: all equal. Row 6: the
    // maximum in the last element. Row 7: -inf everywhere (-1). Row 8: a NaN where the
    // maximum would be.
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
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<int32_t> d_out(std::vector<int32_t>(rows, -7));
    ASSERT_EQ(LaunchArgmaxRows(d_logits.get(), rows, vocab, d_out.get(), nullptr), cudaSuccess);
    const std::vector<int32_t> got = d_out.Download();
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> host(row(r), row(r) + vocab);
      EXPECT_EQ(got[static_cast<size_t>(r)], HostGreedy(host)) << "row " << r;
    }
    EXPECT_EQ(got[1], vocab / 3);
    EXPECT_EQ(got[3], 7);
    EXPECT_EQ(got[4], -1);
    EXPECT_EQ(got[5], 0);
  }
}

TEST(ArgmaxKernelTest, RejectsBadShapes) {
  EXPECT_EQ(LaunchArgmaxRows(nullptr, 1, 0, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxRows(nullptr, -1, 10, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxRows(nullptr, 0, 10, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace kvmesh::kernels
