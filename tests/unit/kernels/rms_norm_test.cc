// The CUDA RMSNorm kernels (plain and fused with the residual add, bf16 and f32 weights)
// against the scalar reference backend, on random rows of awkward widths. Tolerance: the
// GPU sums squares in f32 in a different order than the reference's f64, so
// |out - ref| <= 1e-5 * (1 + |ref|); the fused kernel's residual is the same f32 sum and
// must match bit for bit. Skips where no GPU is present (CI), saying why.
#include "rms_norm/rms_norm.h"

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

constexpr float kEps = 1e-5f;

std::vector<float> RandomRows(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * normal(rng);
  return v;
}

void ExpectClose(const std::vector<float>& out, const std::vector<float>& ref) {
  ASSERT_EQ(out.size(), ref.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << "at " << i;
}

class RmsNormKernelTest : public ::testing::TestWithParam<bool> {};  // bf16 weight?

TEST_P(RmsNormKernelTest, MatchesReferenceBackend) {
  KVMESH_SKIP_WITHOUT_GPU();
  const bool bf16 = GetParam();
  auto reference = backend::CreateReferenceBackend();
  for (int64_t hidden : {1, 64, 257, 4096, 5120 + 3}) {
    for (int64_t tokens : {1, 3, 257}) {
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << " tokens " << tokens);
      const std::vector<float> x = RandomRows(tokens * hidden, static_cast<uint32_t>(hidden + tokens), 2.f);
      std::vector<float> weight = RandomRows(hidden, 7, 0.1f);
      for (float& w : weight) w = RoundToBf16(1.f + w);
      std::vector<uint16_t> weight_bf16;
      for (float w : weight) weight_bf16.push_back(F32ToBf16(w));
      DeviceBuffer<float> dx(x), dout(std::vector<float>(x.size()));
      DeviceBuffer<float> dw(weight);
      DeviceBuffer<uint16_t> dw_bf16(weight_bf16);
      const cudaError_t err = bf16 ? LaunchRmsNormF32Bf16Weight(dx.get(), dw_bf16.get(), kEps, tokens, hidden,
                                                                dout.get(), nullptr)
                                   : LaunchRmsNormF32F32Weight(dx.get(), dw.get(), kEps, tokens, hidden, dout.get(),
                                                               nullptr);
      ASSERT_EQ(err, cudaSuccess);
      std::vector<float> ref(x.size());
      const TensorView w_view = bf16 ? TensorView::Contiguous(weight_bf16.data(), DType::kBF16, {hidden})
                                     : TensorView::Contiguous(weight.data(), DType::kF32, {hidden});
      reference->RmsNorm(TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {tokens, hidden}), w_view,
                         kEps, TensorView::Contiguous(ref.data(), DType::kF32, {tokens, hidden}));
      ExpectClose(dout.Download(), ref);
    }
  }
}

TEST_P(RmsNormKernelTest, FusedAddMatchesReferenceBackend) {
  KVMESH_SKIP_WITHOUT_GPU();
  const bool bf16 = GetParam();
  auto reference = backend::CreateReferenceBackend();
  for (int64_t hidden : {1, 64, 257, 4096, 5120 + 3}) {
    for (int64_t tokens : {1, 3, 257}) {
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << " tokens " << tokens);
      std::vector<float> residual = RandomRows(tokens * hidden, static_cast<uint32_t>(3 * hidden + tokens), 4.f);
      const std::vector<float> x = RandomRows(tokens * hidden, static_cast<uint32_t>(hidden + 5 * tokens), 1.f);
      std::vector<float> weight = RandomRows(hidden, 11, 0.1f);
      for (float& w : weight) w = RoundToBf16(1.f + w);
      std::vector<uint16_t> weight_bf16;
      for (float w : weight) weight_bf16.push_back(F32ToBf16(w));
      DeviceBuffer<float> dres(residual), dx(x), dout(std::vector<float>(x.size()));
      DeviceBuffer<float> dw(weight);
      DeviceBuffer<uint16_t> dw_bf16(weight_bf16);
      const cudaError_t err =
          bf16 ? LaunchAddRmsNormF32Bf16Weight(dres.get(), dx.get(), dw_bf16.get(), kEps, tokens, hidden, dout.get(),
                                               nullptr)
               : LaunchAddRmsNormF32F32Weight(dres.get(), dx.get(), dw.get(), kEps, tokens, hidden, dout.get(),
                                              nullptr);
      ASSERT_EQ(err, cudaSuccess);
      std::vector<float> ref(x.size());
      const TensorView w_view = bf16 ? TensorView::Contiguous(weight_bf16.data(), DType::kBF16, {hidden})
                                     : TensorView::Contiguous(weight.data(), DType::kF32, {hidden});
      reference->AddRmsNorm(TensorView::Contiguous(residual.data(), DType::kF32, {tokens, hidden}),
                            TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {tokens, hidden}),
                            w_view, kEps, TensorView::Contiguous(ref.data(), DType::kF32, {tokens, hidden}));
      ExpectClose(dout.Download(), ref);
      EXPECT_EQ(dres.Download(), residual) << "the residual stream is a plain f32 sum";
    }
  }
}

TEST(RmsNormKernelAliasTest, FusedAddMayWriteOverX) {
  KVMESH_SKIP_WITHOUT_GPU();
  const int64_t tokens = 5, hidden = 257;
  std::vector<float> residual = RandomRows(tokens * hidden, 1, 1.f);
  const std::vector<float> x = RandomRows(tokens * hidden, 2, 1.f);
  std::vector<float> weight(hidden, 1.f);
  DeviceBuffer<float> dres(residual), dx(x), dw(weight);
  ASSERT_EQ(LaunchAddRmsNormF32F32Weight(dres.get(), dx.get(), dw.get(), kEps, tokens, hidden, dx.get(), nullptr),
            cudaSuccess);
  std::vector<float> ref(x.size());
  backend::CreateReferenceBackend()->AddRmsNorm(
      TensorView::Contiguous(residual.data(), DType::kF32, {tokens, hidden}),
      TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {tokens, hidden}),
      TensorView::Contiguous(weight.data(), DType::kF32, {hidden}), kEps,
      TensorView::Contiguous(ref.data(), DType::kF32, {tokens, hidden}));
  ExpectClose(dx.Download(), ref);
}

INSTANTIATE_TEST_SUITE_P(Weights, RmsNormKernelTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Bf16" : "F32"; });

}  // namespace
}  // namespace kvmesh::kernels
