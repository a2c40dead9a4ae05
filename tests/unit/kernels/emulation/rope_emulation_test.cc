// The RoPE kernel's own code (rope_kernel.cuh) on the host emulation, with the launcher's
// grid, against the CPU backends' ApplyRope: llama-style inv_freq with GQA ratios 1 and 4 and
// an odd head_dim of 6 (tolerance as rope_test: 4e-6 * (1 + |ref|)), and llama3-scaled
// inv_freq from ModelConfig::RopeInverseFrequencies (as rope_llama3_test: per pair
// |out - ref| <= 2^-20 * (|x1| + |x2|)); positions up to 131071. What this cannot check: the
// device's sincosf (2 ulp there; the host's here), which is what those tolerances allow for.
#include "host_emulation/prelude.h"

#include "rope/rope_kernel.cuh"

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"
#include "llama3_rope_config.h"

namespace kvmesh::kernels {
namespace {

struct RopeCase {
  int64_t tokens, heads, kv_heads, head_dim;
};

struct RopeData {
  std::vector<float> q, k;
  std::vector<int32_t> positions;
};

RopeData RandomRopeData(const RopeCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> position(0, 131071);
  RopeData d{.q = emulation_test::RandomNormal(static_cast<size_t>(c.tokens * c.heads * c.head_dim), seed),
             .k = emulation_test::RandomNormal(static_cast<size_t>(c.tokens * c.kv_heads * c.head_dim), seed + 1),
             .positions = std::vector<int32_t>(static_cast<size_t>(c.tokens))};
  for (int32_t& p : d.positions) p = position(rng);
  d.positions[0] = 0;
  return d;
}

// q and k rotated by the emulated kernel (`got`) and by `oracle` (`want`).
void Rotate(const RopeCase& c, const std::vector<float>& inv_freq, backend::Backend& oracle, RopeData& got,
            RopeData& want) {
  host_emulation::EmulateGrid(rope::RopeGrid(c.tokens), rope::kThreads, [&] {
    rope::RopeKernel(got.q.data(), got.k.data(), got.positions.data(), inv_freq.data(), static_cast<int>(c.heads),
                     static_cast<int>(c.kv_heads), static_cast<int>(c.head_dim));
  });
  oracle.ApplyRope(TensorView::Contiguous(want.q.data(), DType::kF32, {c.tokens, c.heads, c.head_dim}),
                   TensorView::Contiguous(want.k.data(), DType::kF32, {c.tokens, c.kv_heads, c.head_dim}),
                   want.positions, inv_freq);
}

TEST(RopeEmulationKernelTest, MatchesCpuBackends) {
  for (const auto& oracle : emulation_test::Oracles()) {
    for (const RopeCase& c : {RopeCase{1, 8, 8, 64}, RopeCase{3, 8, 2, 128}, RopeCase{2, 5, 5, 6}}) {
      SCOPED_TRACE(::testing::Message() << oracle->name() << " T " << c.tokens << " H " << c.heads << " Hkv "
                                        << c.kv_heads << " D " << c.head_dim);
      std::vector<float> inv_freq(static_cast<size_t>(c.head_dim / 2));
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        inv_freq[i] = static_cast<float>(
            1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim)));
      }
      RopeData got = RandomRopeData(c, static_cast<uint32_t>(c.tokens * 1000 + c.heads)), want = got;
      Rotate(c, inv_freq, *oracle, got, want);
      emulation_test::ExpectRelativelyClose(got.q, want.q, 4e-6f);
      emulation_test::ExpectRelativelyClose(got.k, want.k, 4e-6f);
    }
  }
}

TEST(RopeEmulationKernelTest, Llama3ScaledInverseFrequenciesMatchCpuBackends) {
  const std::vector<float> inv_freq = test_util::Llama3RopeConfig().RopeInverseFrequencies();
  const RopeCase c{3, 4, 2, 128};
  for (const auto& oracle : emulation_test::Oracles()) {
    SCOPED_TRACE(oracle->name());
    const RopeData in = RandomRopeData(c, 31);
    RopeData got = in, want = in;
    Rotate(c, inv_freq, *oracle, got, want);
    const int64_t half = c.head_dim / 2;
    for (auto [g, w, x] : {std::tuple{&got.q, &want.q, &in.q}, std::tuple{&got.k, &want.k, &in.k}}) {
      for (size_t row = 0; row < x->size(); row += static_cast<size_t>(c.head_dim)) {
        for (size_t i = row; i < row + static_cast<size_t>(half); ++i) {
          const size_t j = i + static_cast<size_t>(half);
          const float bound = 0x1p-20f * (std::fabs((*x)[i]) + std::fabs((*x)[j]));
          ASSERT_LE(std::fabs((*g)[i] - (*w)[i]), bound) << i;
          ASSERT_LE(std::fabs((*g)[j] - (*w)[j]), bound) << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
