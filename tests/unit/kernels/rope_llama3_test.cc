// The CUDA RoPE kernel with Llama 3's rope_scaling (factor 8, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192, theta 500000, head_dim 128),
// fed model::ModelConfig::RopeInverseFrequencies(), against the CPU backend's (and the
// reference backend's) ApplyRope with the same inv_freq, positions up to 131071.
//
// Tolerance, per rotated pair (x1, x2) -> (x1 c - x2 s, x2 c + x1 s):
//   |gpu - cpu| <= 2^-20 * (|x1| + |x2|)
// Both sides round position * inv_freq to the same f32 angle (__fmul_rn on the GPU, a plain
// f32 product on the CPU) and round each product and the sum without FMA, so they differ
// only through cos/sin of that angle: CUDA's sincosf is within 2 ulp at any argument (its
// slow path reduces angles up to ~1.3e5 rad exactly), the CPU's sincosf and the reference's
// rounded f64 cos/sin within 0.5 ulp. 2.5 ulp of |c|, |s| <= 1 is <= 2.5 * 2^-24 absolute,
// times |x1| + |x2|, plus an ulp of each product re-rounded: about 6 * 2^-24 * (|x1| + |x2|);
// 2^-20 leaves a 2.7x margin. Skips where no GPU is present (CI), saying why.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "llama3_rope_config.h"
#include "model/model_config.h"
#include "rope/rope.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

TEST(RopeLlama3KernelTest, InverseFrequenciesAreScaled) {
  // Needs no GPU: that the config really applies llama3 scaling (else the test below would
  // only repeat rope_test). High frequencies (wavelength < 8192 / 4) are kept; low ones
  // (wavelength > 8192) divided by the factor 8.
  model::ModelConfig plain = test_util::Llama3RopeConfig();
  plain.rope_scaling = {};
  const std::vector<float> scaled = test_util::Llama3RopeConfig().RopeInverseFrequencies();
  const std::vector<float> unscaled = plain.RopeInverseFrequencies();
  ASSERT_EQ(scaled.size(), 64u);
  ASSERT_EQ(unscaled.size(), 64u);
  EXPECT_EQ(scaled[0], unscaled[0]);
  EXPECT_FLOAT_EQ(scaled[63], unscaled[63] / 8.0f);
  int changed = 0;
  for (size_t i = 0; i < scaled.size(); ++i) changed += scaled[i] != unscaled[i] ? 1 : 0;
  EXPECT_GT(changed, 10);
  EXPECT_LT(changed, 64);
}

TEST(RopeLlama3KernelTest, MatchesCpuBackendsWithScaledFrequencies) {
  KVMESH_SKIP_WITHOUT_GPU();
  const std::vector<float> inv_freq = test_util::Llama3RopeConfig().RopeInverseFrequencies();
  const int64_t head_dim = 128;
  const int64_t half = head_dim / 2;
  std::vector<std::unique_ptr<backend::Backend>> oracles;
  oracles.push_back(backend::CreateReferenceBackend());
  auto cpu = backend::CreateCpuBackend({});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  oracles.push_back(std::move(cpu).value());

  struct Case {
    int64_t tokens, heads, kv_heads;
  };
  for (const Case& c : {Case{1, 32, 8}, Case{257, 32, 8}, Case{67, 8, 1}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.tokens << " H " << c.heads << " Hkv " << c.kv_heads);
    std::mt19937 rng(static_cast<uint32_t>(c.tokens * 31 + c.heads));
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int32_t> position(0, 131071);
    std::vector<float> q(static_cast<size_t>(c.tokens * c.heads * head_dim));
    std::vector<float> k(static_cast<size_t>(c.tokens * c.kv_heads * head_dim));
    for (float& v : q) v = normal(rng);
    for (float& v : k) v = normal(rng);
    std::vector<int32_t> positions(static_cast<size_t>(c.tokens));
    for (int32_t& p : positions) p = position(rng);
    // The edges: 0, around the original context (8192) and the last position.
    const int32_t edges[] = {0, 131071, 8191, 8192, 65536, 131070};
    for (size_t i = 0; i < positions.size() && i < std::size(edges); ++i) positions[i] = edges[i];

    DeviceBuffer<float> dq(q), dk(k), dinv(inv_freq);
    DeviceBuffer<int32_t> dpos(positions);
    ASSERT_EQ(LaunchRopeF32(dq.get(), dk.get(), dpos.get(), dinv.get(), c.tokens, c.heads, c.kv_heads, head_dim,
                            nullptr),
              cudaSuccess);
    const std::vector<float> gq = dq.Download(), gk = dk.Download();

    for (const auto& oracle : oracles) {
      SCOPED_TRACE(oracle->name());
      std::vector<float> rq = q, rk = k;
      oracle->ApplyRope(TensorView::Contiguous(rq.data(), DType::kF32, {c.tokens, c.heads, head_dim}),
                        TensorView::Contiguous(rk.data(), DType::kF32, {c.tokens, c.kv_heads, head_dim}), positions,
                        inv_freq);
      float worst = 0;  // largest |gpu - cpu| / (|x1| + |x2|), recorded for the log
      for (const auto& [input, gpu, cpu_out, heads] :
           {std::tuple{&q, &gq, &rq, c.heads}, std::tuple{&k, &gk, &rk, c.kv_heads}}) {
        const auto row = static_cast<size_t>(heads * head_dim);  // one token's elements
        for (size_t base = 0; base < input->size(); base += static_cast<size_t>(head_dim)) {
          for (size_t a = base; a < base + static_cast<size_t>(half); ++a) {
            const size_t b = a + static_cast<size_t>(half);
            const float magnitude = std::fabs((*input)[a]) + std::fabs((*input)[b]);
            for (size_t at : {a, b}) {
              const float diff = std::fabs((*gpu)[at] - (*cpu_out)[at]);
              if (magnitude > 0) worst = std::max(worst, diff / magnitude);
              ASSERT_LE(diff, std::ldexp(magnitude, -20))
                  << "element " << at << " position " << positions[at / row] << " gpu " << (*gpu)[at] << " cpu "
                  << (*cpu_out)[at];
            }
          }
        }
      }
      RecordProperty("worst_diff_over_pair_magnitude_" + std::string(oracle->name()), std::to_string(worst));
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
