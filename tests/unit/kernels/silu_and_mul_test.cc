// The CUDA SiLU-and-mul kernel against the scalar reference backend, on the float4 path
// (I % 4 == 0) and the scalar one (odd I), 1 and 257 tokens, gate values up to +-30 so
// that exp saturates. The GPU works in f32 (expf within 2 ulp), the reference in f64:
// |out - ref| <= 1e-5 * (1 + |ref|). Skips where no GPU is present (CI), saying why.
#include "silu_and_mul/silu_and_mul.h"

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

TEST(SiluAndMulKernelTest, MatchesReferenceBackend) {
  KVMESH_SKIP_WITHOUT_GPU();
  auto reference = backend::CreateReferenceBackend();
  for (int64_t inter : {1, 4, 257, 1024, 1027, 14336}) {
    for (int64_t tokens : {1, 3, 257}) {
      SCOPED_TRACE(::testing::Message() << "I " << inter << " T " << tokens);
      std::mt19937 rng(static_cast<uint32_t>(inter * 7 + tokens));
      std::normal_distribution<float> normal(0.f, 4.f);
      std::vector<float> gate_up(static_cast<size_t>(tokens * 2 * inter));
      for (float& v : gate_up) v = normal(rng);
      gate_up[0] = 30.f;
      if (inter > 1) gate_up[1] = -30.f;
      DeviceBuffer<float> dgu(gate_up), dout(std::vector<float>(static_cast<size_t>(tokens * inter)));
      ASSERT_EQ(LaunchSiluAndMulF32(dgu.get(), tokens, inter, dout.get(), nullptr), cudaSuccess);
      std::vector<float> ref(static_cast<size_t>(tokens * inter));
      reference->SiluAndMul(TensorView::Contiguous(gate_up.data(), DType::kF32, {tokens, 2 * inter}),
                            TensorView::Contiguous(ref.data(), DType::kF32, {tokens, inter}));
      const std::vector<float> out = dout.Download();
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5f * (1 + std::fabs(ref[i]))) << i;
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
