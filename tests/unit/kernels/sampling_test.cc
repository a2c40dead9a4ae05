// The CUDA top-k / top-p sampling kernel against a host oracle with engine::SequenceSampler's
// semantics (libs/engine/sampler.cc): greedy argmax (lowest id on ties), top-k then top-p
// over the top-k survivors, one inverse-CDF draw over the survivors in id order. Seeds are
// fixed, so every test is deterministic. Skips where no GPU is present (CI), saying why;
// the Philox known-answer test and the argument checks run everywhere.
//
// Distribution test: 20000 draws (one per offset) of a 50-token vocabulary; Pearson's
// chi-square of the counts over the survivors against the renormalised survivor
// probabilities must stay below df + 5 sqrt(2 df) (about the 1e-5 upper tail for these
// df); a non-survivor drawn even once fails.
#include "sampling/sampling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "sampling/philox.cuh"
#include "sampling_oracle.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;
using test_util::HostArgmax;
using test_util::HostDraw;
using test_util::HostSurvivors;
using test_util::kInf;
using test_util::kNaN;
using test_util::RandomLogits;
using test_util::RowParams;
using test_util::Survivors;

// Runs the kernel on rows of `logits` ([rows, vocab]) and returns the chosen ids.
std::vector<int32_t> RunKernel(const std::vector<float>& logits, int64_t vocab, const std::vector<RowParams>& params) {
  const auto rows = static_cast<int64_t>(params.size());
  const test_util::RowArrays a = test_util::SplitRowParams(params);
  DeviceBuffer<float> d_logits(logits), d_temperature(a.temperature), d_top_p(a.top_p);
  DeviceBuffer<int32_t> d_top_k(a.top_k);
  DeviceBuffer<uint64_t> d_seeds(a.seeds), d_offsets(a.offsets);
  DeviceBuffer<int32_t> d_out(std::vector<int32_t>(params.size(), -7));  // poison
  const size_t workspace_bytes = SampleTopKTopPWorkspaceBytes(rows, vocab);
  DeviceBuffer<unsigned char> workspace(std::vector<unsigned char>(workspace_bytes + 1));
  EXPECT_EQ(LaunchSampleTopKTopP(d_logits.get(), rows, vocab, d_temperature.get(), d_top_k.get(), d_top_p.get(),
                                 d_seeds.get(), d_offsets.get(), d_out.get(), workspace.get(), workspace_bytes,
                                 nullptr),
            cudaSuccess);
  return d_out.Download();
}

TEST(SamplingKernelTest, PhiloxMatchesRandom123KnownAnswers) {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  const Philox4x32 zero = Philox4x32x10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const Philox4x32 ones = Philox4x32x10({{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  const Philox4x32 pi = Philox4x32x10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
  const double u = PhiloxUniform(1, 2);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
  EXPECT_NE(PhiloxUniform(1, 2), PhiloxUniform(1, 3));
  EXPECT_NE(PhiloxUniform(1, 2), PhiloxUniform(2, 2));
}

TEST(SamplingKernelTest, RejectsBadArguments) {
  // Checked before any launch, so these hold without a GPU too.
  float f = 0;
  int32_t i = 0;
  uint64_t u = 0;
  EXPECT_EQ(LaunchSampleTopKTopP(&f, 1, 0, &f, &i, &f, &u, &u, &i, nullptr, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSampleTopKTopP(&f, -1, 8, &f, &i, &f, &u, &u, &i, nullptr, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSampleTopKTopP(&f, 1, int64_t{1} << 31, &f, &i, &f, &u, &u, &i, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSampleTopKTopP(nullptr, 1, 8, &f, &i, &f, &u, &u, &i, nullptr, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSampleTopKTopP(nullptr, 0, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0,
                                 nullptr),
            cudaSuccess);
}

TEST(SamplingKernelTest, GreedyIsArgmaxWithLowestIdOnTies) {
  KVMESH_SKIP_WITHOUT_GPU();
  for (const int64_t vocab : {int64_t{32000}, int64_t{128256}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    const std::vector<float> logits = test_util::GreedyEdgeRows(vocab, rng);
    test_util::ExpectGreedyEdgeRows(logits, vocab, RunKernel(logits, vocab, test_util::GreedyRowParams()));
  }
}

TEST(SamplingKernelTest, TopKOneIsArgmaxAtAnyTemperature) {
  KVMESH_SKIP_WITHOUT_GPU();
  const int64_t vocab = 32000;
  std::mt19937 rng(11);
  constexpr int64_t kRows = 16;
  std::vector<float> logits = RandomLogits(kRows, vocab, 2.0f, rng);
  std::fill(logits.begin() + vocab, logits.begin() + 2 * vocab, -1.0f);  // all equal: id 0
  std::vector<RowParams> params(kRows);
  const float temperatures[] = {0.3f, 1.0f, 2.0f, 100.0f};
  for (size_t r = 0; r < params.size(); ++r) {
    params[r] = {.temperature = temperatures[r % 4], .top_k = 1, .top_p = r % 3 == 0 ? 0.7f : 1.0f, .seed = r * 7,
                 .offset = r};
  }
  const std::vector<int32_t> got = RunKernel(logits, vocab, params);
  for (int64_t r = 0; r < kRows; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)], HostArgmax(logits.data() + r * vocab, vocab)) << "row " << r;
  }
}

TEST(SamplingKernelTest, DrawsLieInHostSurvivorSetAndMatchHostDraw) {
  KVMESH_SKIP_WITHOUT_GPU();
  struct Config {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const Config configs[] = {{1.0f, 0, 1.0f},  {0.7f, 50, 1.0f},  {1.0f, 0, 0.9f},   {1.3f, 40, 0.8f},
                            {0.5f, 5, 0.95f}, {2.0f, 1000, 0.5f}, {1.0f, 0, 0.001f}, {0.9f, 3, 1e-6f}};
  int64_t draws = 0, exact = 0;
  for (const int64_t vocab : {int64_t{1000}, int64_t{32000}, int64_t{128256}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::mt19937 rng(static_cast<uint32_t>(vocab) * 3);
    const int64_t rows = vocab > 100000 ? 16 : 64;
    std::vector<float> logits = RandomLogits(rows, vocab, 2.5f, rng);
    // NaNs (never chosen), -inf, and ties among high logits.
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * vocab;
      for (int j = 0; j < 20; ++j) row[static_cast<size_t>(rng() % vocab)] = kNaN;
      row[static_cast<size_t>(rng() % vocab)] = -kInf;
      row[static_cast<size_t>(rng() % vocab)] = 9.0f;
      row[static_cast<size_t>(rng() % vocab)] = 9.0f;
    }
    for (int step = 0; step < 4; ++step) {
      std::vector<RowParams> params(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const Config& c = configs[static_cast<size_t>(r) % std::size(configs)];
        params[static_cast<size_t>(r)] = {.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p,
                                          .seed = 1000 + static_cast<uint64_t>(r), .offset = static_cast<uint64_t>(step)};
      }
      const std::vector<int32_t> got = RunKernel(logits, vocab, params);
      for (int64_t r = 0; r < rows; ++r) {
        const RowParams& p = params[static_cast<size_t>(r)];
        const Survivors s = HostSurvivors(logits.data() + r * vocab, vocab, p);
        const int32_t id = got[static_cast<size_t>(r)];
        ASSERT_TRUE(std::binary_search(s.ids.begin(), s.ids.end(), id))
            << "row " << r << " step " << step << " drew " << id << ", not among " << s.ids.size() << " survivors";
        ++draws;
        exact += id == HostDraw(s, p) ? 1 : 0;
      }
    }
  }
  // The same uniform through the same inverse CDF: only last-bit differences of expf (2 ulp
  // on the GPU) and of the summation order can move a draw to its neighbour, which with
  // ~1e5 survivors happens to a fraction of a percent of draws; a wrong uniform or order
  // would miss nearly all.
  EXPECT_GE(exact, draws * 97 / 100) << exact << " of " << draws << " draws equal the host's";
}

// Counts of `draws` draws (offsets 0..draws-1, one row each) of one row of logits.
std::vector<int64_t> DrawCounts(const std::vector<float>& row, RowParams p, int64_t draws) {
  const auto vocab = static_cast<int64_t>(row.size());
  std::vector<float> logits;
  std::vector<RowParams> params;
  for (int64_t i = 0; i < draws; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    p.offset = static_cast<uint64_t>(i);
    params.push_back(p);
  }
  std::vector<int64_t> counts(static_cast<size_t>(vocab));
  for (int32_t id : RunKernel(logits, vocab, params)) {
    if (id < 0 || id >= vocab) {
      ADD_FAILURE() << "id " << id << " out of range";
      continue;
    }
    ++counts[static_cast<size_t>(id)];
  }
  return counts;
}

// The statistical tests: a small vocabulary, many draws (one row per offset).
constexpr int64_t kVocab = 50;
constexpr int64_t kDraws = 20000;

// One row of kVocab logits uniform in [-spread, spread]: every token keeps a probability
// large enough (>= ~1/1000) for a chi-square's expected counts.
std::vector<float> SmallVocabRow(float spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-spread, spread);
  std::vector<float> row(kVocab);
  for (float& x : row) x = uniform(rng);
  return row;
}

TEST(SamplingKernelTest, DistributionMatchesRenormalisedSurvivors) {
  KVMESH_SKIP_WITHOUT_GPU();
  std::vector<float> row = SmallVocabRow(1.5f, 5);
  row[7] = kNaN;
  for (const RowParams& p : {RowParams{.temperature = 1.0f, .seed = 42}, RowParams{.temperature = 1.0f, .top_k = 10, .seed = 43},
                             RowParams{.temperature = 0.7f, .top_p = 0.8f, .seed = 44},
                             RowParams{.temperature = 1.3f, .top_k = 20, .top_p = 0.9f, .seed = 45}}) {
    SCOPED_TRACE(::testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p);
    const Survivors s = HostSurvivors(row.data(), kVocab, p);
    const double total = std::accumulate(s.weights.begin(), s.weights.end(), 0.0);
    const std::vector<int64_t> counts = DrawCounts(row, p, kDraws);
    double chi2 = 0;
    int64_t in_set = 0;
    for (size_t i = 0; i < s.ids.size(); ++i) {
      const double expected = static_cast<double>(kDraws) * s.weights[i] / total;
      const double observed = static_cast<double>(counts[static_cast<size_t>(s.ids[i])]);
      chi2 += (observed - expected) * (observed - expected) / expected;
      in_set += counts[static_cast<size_t>(s.ids[i])];
    }
    EXPECT_EQ(in_set, kDraws) << "some draws fell outside the survivors";
    const double df = static_cast<double>(s.ids.size()) - 1;
    EXPECT_LT(chi2, df + 5 * std::sqrt(2 * df)) << "chi-square over " << s.ids.size() << " survivors";
  }
}

TEST(SamplingKernelTest, SameSeedAndOffsetGiveSameTokenAndRowsAreIndependent) {
  KVMESH_SKIP_WITHOUT_GPU();
  const std::vector<float> row = SmallVocabRow(1.0f, 9);
  // Rows 2i and 2i+1 share logits and offset i; even rows have seed 1, odd rows seed 2.
  // The whole batch is launched twice: identical tokens.
  std::vector<float> logits;
  std::vector<RowParams> params;
  for (int64_t i = 0; i < kDraws; ++i) {
    for (uint64_t seed : {uint64_t{1}, uint64_t{2}}) {
      logits.insert(logits.end(), row.begin(), row.end());
      params.push_back({.temperature = 1.0f, .seed = seed, .offset = static_cast<uint64_t>(i)});
    }
  }
  const std::vector<int32_t> first = RunKernel(logits, kVocab, params);
  const std::vector<int32_t> again = RunKernel(logits, kVocab, params);
  EXPECT_EQ(first, again) << "same seed and offset must give the same token";
  // Same seed and offset in another row of the same launch: same token.
  std::vector<RowParams> swapped = params;
  std::swap(swapped[0], swapped[1]);
  const std::vector<int32_t> swapped_out = RunKernel(logits, kVocab, swapped);
  EXPECT_EQ(swapped_out[0], first[1]);
  EXPECT_EQ(swapped_out[1], first[0]);

  // Independence of the two seeds' rows: they agree at the rate sum_i p_i^2.
  const Survivors s = HostSurvivors(row.data(), kVocab, params[0]);
  const double total = std::accumulate(s.weights.begin(), s.weights.end(), 0.0);
  double agree_rate = 0;
  for (double w : s.weights) agree_rate += (w / total) * (w / total);
  int64_t agree = 0;
  for (int64_t i = 0; i < kDraws; ++i) agree += first[static_cast<size_t>(2 * i)] == first[static_cast<size_t>(2 * i + 1)];
  const double expected = agree_rate * kDraws;
  const double sigma = std::sqrt(kDraws * agree_rate * (1 - agree_rate));
  EXPECT_NEAR(static_cast<double>(agree), expected, 5 * sigma) << "rows with different seeds agree too often or too rarely";
}

}  // namespace
}  // namespace kvmesh::kernels
