// The RMSNorm kernel's own code (rms_norm_kernel.cuh) on the host emulation
// (kernels/host_emulation: one std::thread per CUDA thread), with the launcher's grid,
// against the reference backend: plain and fused, f32 and bf16 weights, widths below,
// around and far above the block's 256 threads, and the fused kernel writing over x.
// Tolerances as rms_norm_test: |out - ref| <= 1e-5 * (1 + |ref|), the fused residual bit
// for bit. What this cannot check: the device's rsqrtf (approximate there, exact here; the
// tolerance covers both) and anything about timing or the memory model beyond barriers.
#include "host_emulation/prelude.h"

#include "rms_norm/rms_norm_kernel.cuh"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

using emulation_test::ExpectRelativelyClose;
using emulation_test::RandomNormal;

constexpr float kEps = 1e-5f;

// out = RmsNorm(x) (residual == nullptr) or residual += x, out = RmsNorm(residual).
void EmulateRmsNorm(bool bf16, float* residual, const float* x, const std::vector<float>& weight,
                    const std::vector<uint16_t>& weight_bf16, int64_t tokens, int64_t hidden, float* out) {
  const dim3 grid = rms_norm::RmsNormGrid(tokens);
  const auto* w16 = reinterpret_cast<const __nv_bfloat16*>(weight_bf16.data());
  const float* w32 = weight.data();
  host_emulation::EmulateGrid(grid, rms_norm::kThreads, [&] {
    if (residual == nullptr) {
      bf16 ? rms_norm::RmsNormKernel<__nv_bfloat16, false>(nullptr, x, w16, kEps, hidden, out)
           : rms_norm::RmsNormKernel<float, false>(nullptr, x, w32, kEps, hidden, out);
    } else {
      bf16 ? rms_norm::RmsNormKernel<__nv_bfloat16, true>(residual, x, w16, kEps, hidden, out)
           : rms_norm::RmsNormKernel<float, true>(residual, x, w32, kEps, hidden, out);
    }
  });
}

class RmsNormEmulationKernelTest : public ::testing::TestWithParam<bool> {};  // bf16 weight?

TEST_P(RmsNormEmulationKernelTest, PlainAndFusedMatchReferenceBackend) {
  const bool bf16 = GetParam();
  auto reference = backend::CreateReferenceBackend();
  for (int64_t hidden : {1, 257, 5123}) {
    for (int64_t tokens : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "hidden " << hidden << " tokens " << tokens);
      const size_t n = static_cast<size_t>(tokens * hidden);
      const std::vector<float> x = RandomNormal(n, static_cast<uint32_t>(hidden + tokens), 2.f);
      std::vector<float> weight = RandomNormal(static_cast<size_t>(hidden), 7, 0.1f);
      for (float& w : weight) w = RoundToBf16(1.f + w);
      std::vector<uint16_t> weight_bf16;
      for (float w : weight) weight_bf16.push_back(F32ToBf16(w));
      const TensorView w_view = bf16 ? TensorView::Contiguous(weight_bf16.data(), DType::kBF16, {hidden})
                                     : TensorView::Contiguous(weight.data(), DType::kF32, {hidden});
      auto rows = [&](const float* p) {
        return TensorView::Contiguous(const_cast<float*>(p), DType::kF32, {tokens, hidden});
      };

      std::vector<float> out(n), ref(n);
      EmulateRmsNorm(bf16, nullptr, x.data(), weight, weight_bf16, tokens, hidden, out.data());
      reference->RmsNorm(rows(x.data()), w_view, kEps, rows(ref.data()));
      ExpectRelativelyClose(out, ref, 1e-5f);

      const std::vector<float> residual_in = RandomNormal(n, static_cast<uint32_t>(3 * hidden + tokens), 4.f);
      std::vector<float> residual = residual_in, ref_residual = residual_in;
      EmulateRmsNorm(bf16, residual.data(), x.data(), weight, weight_bf16, tokens, hidden, out.data());
      reference->AddRmsNorm(rows(ref_residual.data()), rows(x.data()), w_view, kEps, rows(ref.data()));
      ExpectRelativelyClose(out, ref, 1e-5f);
      EXPECT_EQ(residual, ref_residual) << "the residual stream is a plain f32 sum";
    }
  }
}

TEST_P(RmsNormEmulationKernelTest, FusedMayWriteOverX) {
  const bool bf16 = GetParam();
  const int64_t tokens = 2, hidden = 257;
  const size_t n = static_cast<size_t>(tokens * hidden);
  const std::vector<float> residual_in = RandomNormal(n, 1), x_in = RandomNormal(n, 2);
  const std::vector<float> weight(static_cast<size_t>(hidden), 1.f);
  const std::vector<uint16_t> weight_bf16(static_cast<size_t>(hidden), F32ToBf16(1.f));
  std::vector<float> residual = residual_in, x = x_in;
  EmulateRmsNorm(bf16, residual.data(), x.data(), weight, weight_bf16, tokens, hidden, x.data());
  std::vector<float> ref_residual = residual_in, ref(n);
  backend::CreateReferenceBackend()->AddRmsNorm(
      TensorView::Contiguous(ref_residual.data(), DType::kF32, {tokens, hidden}),
      TensorView::Contiguous(const_cast<float*>(x_in.data()), DType::kF32, {tokens, hidden}),
      TensorView::Contiguous(const_cast<float*>(weight.data()), DType::kF32, {hidden}), kEps,
      TensorView::Contiguous(ref.data(), DType::kF32, {tokens, hidden}));
  ExpectRelativelyClose(x, ref, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Weights, RmsNormEmulationKernelTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Bf16" : "F32"; });

}  // namespace
}  // namespace kvmesh::kernels
