// The top-k / top-p sampling kernel's own code (sampling_kernel.cuh: 512 threads, the 16-way
// pivot searches for the top-k and top-p cuts, the Philox draw) on the host emulation, with
// the launcher's grid, against sampling_test's host oracle (sampling_oracle.h: the host
// sampler's semantics) on a few rows of small vocabularies: sampling_test's greedy rows
// (ties, NaN, +inf, nothing finite) exactly, and sampled rows (NaNs, -inf, tied high logits; top-k, top-p and
// both, down to top_p 1e-6) whose draws must lie in the oracle's survivor set and equal its
// draw for at least 97% of them, as on the GPU. What this cannot check: the device's expf
// (the host's here, which is the oracle's too) and the statistical tests (20000 draws per
// case would take 10 million threads here).
#include "host_emulation/prelude.h"

#include "sampling/sampling_kernel.cuh"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "host_emulation/grid.h"
#include "sampling_oracle.h"

namespace kvmesh::kernels {
namespace {

using test_util::kInf;
using test_util::kNaN;
using test_util::RowParams;

// What LaunchSampleTopKTopP would compute for rows of `logits` ([rows, vocab]), on the host.
std::vector<int32_t> EmulateSampling(const std::vector<float>& logits, int64_t vocab,
                                     const std::vector<RowParams>& params) {
  const test_util::RowArrays a = test_util::SplitRowParams(params);
  std::vector<int32_t> out(params.size(), -7);  // poison
  host_emulation::EmulateGrid(sampling::SampleTopKTopPGrid(static_cast<int64_t>(params.size())), sampling::kThreads,
                              [&] {
                                sampling::SampleTopKTopPKernel(logits.data(), vocab, a.temperature.data(),
                                                               a.top_k.data(), a.top_p.data(), a.seeds.data(),
                                                               a.offsets.data(), out.data());
                              });
  return out;
}

TEST(SamplingEmulationKernelTest, GreedyIsArgmaxWithLowestIdOnTies) {
  const int64_t vocab = 1001;
  std::mt19937 rng(5);
  const std::vector<float> logits = test_util::GreedyEdgeRows(vocab, rng);
  test_util::ExpectGreedyEdgeRows(logits, vocab, EmulateSampling(logits, vocab, test_util::GreedyRowParams()));
}

TEST(SamplingEmulationKernelTest, DrawsLieInHostSurvivorSetAndMatchHostDraw) {
  struct Config {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  // Each search costs the emulation about half a second per row: a few rows per vocabulary.
  // 1537 > 3 x 512 ids (a thread's draw range holds several); 50 < 512 (most hold none).
  struct VocabConfigs {
    int64_t vocab;
    std::vector<Config> configs;
  };
  const VocabConfigs cases[] = {
      {1537, {{1.0f, 0, 1.0f}, {1.3f, 40, 0.8f}, {0.5f, 5, 0.95f}, {1.0f, 0, 0.001f}, {0.9f, 3, 1e-6f}}},
      {50, {{0.7f, 50, 1.0f}, {2.0f, 1000, 0.5f}, {0.3f, 1, 0.7f}}}};
  int64_t draws = 0, exact = 0;
  for (const auto& [vocab, configs] : cases) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::mt19937 rng(static_cast<uint32_t>(vocab) * 3);
    const auto rows = static_cast<int64_t>(configs.size());
    std::vector<float> logits = test_util::RandomLogits(rows, vocab, 2.5f, rng);
    // NaNs (never chosen), -inf, and ties among high logits.
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * vocab;
      for (int j = 0; j < 3; ++j) row[static_cast<size_t>(rng() % vocab)] = kNaN;
      row[static_cast<size_t>(rng() % vocab)] = -kInf;
      row[static_cast<size_t>(rng() % vocab)] = 9.0f;
      row[static_cast<size_t>(rng() % vocab)] = 9.0f;
    }
    std::vector<RowParams> params(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const Config& c = configs[static_cast<size_t>(r)];
      params[static_cast<size_t>(r)] = {.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p,
                                        .seed = 1000 + static_cast<uint64_t>(r),
                                        .offset = static_cast<uint64_t>(vocab)};
    }
    const std::vector<int32_t> got = EmulateSampling(logits, vocab, params);
    for (int64_t r = 0; r < rows; ++r) {
      const RowParams& p = params[static_cast<size_t>(r)];
      const test_util::Survivors s = test_util::HostSurvivors(logits.data() + r * vocab, vocab, p);
      const int32_t id = got[static_cast<size_t>(r)];
      ASSERT_TRUE(std::binary_search(s.ids.begin(), s.ids.end(), id))
          << "row " << r << " drew " << id << ", not among " << s.ids.size() << " survivors";
      ++draws;
      exact += id == test_util::HostDraw(s, p) ? 1 : 0;
    }
  }
  EXPECT_GE(exact, draws * 97 / 100) << exact << " of " << draws << " draws equal the host's";
}

// Rows without top-k or top-p skip both searches, so many are cheap here: the draw's id-order
// inverse CDF across 512 threads' ranges (several ids each, NaN and -inf among them) at many
// uniforms.
TEST(SamplingEmulationKernelTest, PlainDrawsMatchHostDraw) {
  const int64_t vocab = 1537, rows = 32;
  std::mt19937 rng(77);
  std::vector<float> row = test_util::RandomLogits(1, vocab, 1.0f, rng);
  for (int j = 0; j < 5; ++j) row[static_cast<size_t>(rng() % vocab)] = kNaN;
  row[static_cast<size_t>(rng() % vocab)] = -kInf;
  std::vector<float> logits;
  std::vector<RowParams> params;
  for (int64_t r = 0; r < rows; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    params.push_back({.temperature = r % 2 == 0 ? 1.0f : 0.6f, .seed = 7, .offset = static_cast<uint64_t>(r)});
  }
  const std::vector<int32_t> got = EmulateSampling(logits, vocab, params);
  int64_t exact = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowParams& p = params[static_cast<size_t>(r)];
    const test_util::Survivors s = test_util::HostSurvivors(row.data(), vocab, p);
    const int32_t id = got[static_cast<size_t>(r)];
    ASSERT_TRUE(std::binary_search(s.ids.begin(), s.ids.end(), id)) << "row " << r << " drew " << id;
    exact += id == test_util::HostDraw(s, p) ? 1 : 0;
  }
  EXPECT_GE(exact, rows * 97 / 100) << exact << " of " << rows << " draws equal the host's";
}

}  // namespace
}  // namespace kvmesh::kernels
