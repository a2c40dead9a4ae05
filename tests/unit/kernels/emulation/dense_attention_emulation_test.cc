// The dense attention kernel's own code (dense_attention_kernel.cuh) on the host emulation,
// with the launcher's grid, against the CPU backends' DenseAttention: GQA (4 query heads on 2
// KV heads), head_dim 64 and 200 (the second output dimension per thread), positions within
// the first 128-position chunk and beyond it (the online rescaling across chunks).
// Tolerance as cuda_backend_test: |out - ref| <= 2e-5 * (1 + |ref|). What this cannot check:
// the device's expf (2 ulp there, the host's here).
#include "host_emulation/prelude.h"

#include "dense_attention/dense_attention_kernel.cuh"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(DenseAttentionEmulationKernelTest, MatchesCpuBackends) {
  const int64_t s = 150, h = 4, hkv = 2;
  const std::vector<int32_t> positions = {3, 149};
  const int64_t t = static_cast<int64_t>(positions.size());
  for (int64_t d : {64, 200}) {
    SCOPED_TRACE(::testing::Message() << "D " << d);
    const std::vector<float> q = emulation_test::RandomNormal(static_cast<size_t>(t * h * d), 1);
    const std::vector<float> k = emulation_test::RandomNormal(static_cast<size_t>(s * hkv * d), 2);
    const std::vector<float> v = emulation_test::RandomNormal(k.size(), 3);
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    std::vector<float> out(q.size(), -1.f);
    host_emulation::EmulateGrid(dense_attention::DenseAttentionGrid(t, h), dense_attention::kThreads, [&] {
      dense_attention::DenseAttentionKernel(q.data(), k.data(), v.data(), positions.data(), h, hkv, d, scale,
                                            out.data());
    });
    auto view = [](const std::vector<float>& x, int64_t rows, int64_t heads, int64_t dims) {
      return TensorView::Contiguous(const_cast<float*>(x.data()), DType::kF32, {rows, heads, dims});
    };
    for (const auto& oracle : emulation_test::Oracles()) {
      SCOPED_TRACE(oracle->name());
      std::vector<float> ref(q.size());
      oracle->DenseAttention(view(q, t, h, d), view(k, s, hkv, d), view(v, s, hkv, d), positions, scale,
                             view(ref, t, h, d));
      emulation_test::ExpectRelativelyClose(out, ref, 2e-5f);
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
