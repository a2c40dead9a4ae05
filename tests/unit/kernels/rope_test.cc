// The CUDA RoPE kernel against the scalar reference backend: GQA ratios 1/4/8, head_dim
// 64/128 (and an odd-sized 2 * 3), 1 and 257 tokens, positions up to 131071 with llama-style
// inv_freq. Both compute the angle as the same f32 product; the GPU's sincosf is within
// 2 ulp of the reference's rounded f64 cos/sin, so |out - ref| <= 4e-6 * (1 + |ref|).
// Skips where no GPU is present (CI), saying why.
#include "rope/rope.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

struct RopeCase {
  int64_t tokens, heads, kv_heads, head_dim;
};

TEST(RopeKernelTest, MatchesReferenceBackend) {
  KVMESH_SKIP_WITHOUT_GPU();
  auto reference = backend::CreateReferenceBackend();
  for (const RopeCase& c : {RopeCase{1, 8, 8, 64}, RopeCase{257, 8, 2, 128}, RopeCase{257, 32, 4, 64},
                            RopeCase{3, 8, 1, 128}, RopeCase{17, 5, 5, 6}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.tokens << " H " << c.heads << " Hkv " << c.kv_heads << " D "
                                      << c.head_dim);
    std::mt19937 rng(static_cast<uint32_t>(c.tokens * 1000 + c.heads));
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int32_t> position(0, 131071);
    std::vector<float> q(static_cast<size_t>(c.tokens * c.heads * c.head_dim));
    std::vector<float> k(static_cast<size_t>(c.tokens * c.kv_heads * c.head_dim));
    for (float& v : q) v = normal(rng);
    for (float& v : k) v = normal(rng);
    std::vector<int32_t> positions(static_cast<size_t>(c.tokens));
    for (int32_t& p : positions) p = position(rng);
    positions[0] = 0;
    std::vector<float> inv_freq(static_cast<size_t>(c.head_dim / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) /
                                                                    static_cast<double>(c.head_dim)));
    }
    DeviceBuffer<float> dq(q), dk(k), dinv(inv_freq);
    DeviceBuffer<int32_t> dpos(positions);
    ASSERT_EQ(LaunchRopeF32(dq.get(), dk.get(), dpos.get(), dinv.get(), c.tokens, c.heads, c.kv_heads, c.head_dim,
                            nullptr),
              cudaSuccess);
    reference->ApplyRope(TensorView::Contiguous(q.data(), DType::kF32, {c.tokens, c.heads, c.head_dim}),
                         TensorView::Contiguous(k.data(), DType::kF32, {c.tokens, c.kv_heads, c.head_dim}), positions,
                         inv_freq);
    const std::vector<float> gq = dq.Download(), gk = dk.Download();
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(gq[i], q[i], 4e-6f * (1 + std::fabs(q[i]))) << "q at " << i;
    for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(gk[i], k[i], 4e-6f * (1 + std::fabs(k[i]))) << "k at " << i;
  }
}

TEST(RopeKernelTest, RejectsOddOrHugeHeadDim) {
  // Argument checks happen before any launch, so they hold without a GPU too.
  EXPECT_EQ(LaunchRopeF32(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 63, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRopeF32(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 2048, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRopeF32(nullptr, nullptr, nullptr, nullptr, 0, 1, 1, 64, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace kvmesh::kernels
