// The SiLU-and-mul kernel's own code (silu_and_mul_kernel.cuh) on the host emulation, with
// the launcher's grid, against the reference backend: the float4 path (I % 4 == 0) and the
// scalar one (odd I), one and two column blocks, gate values of +-30 so exp saturates.
// Tolerance as silu_and_mul_test: |out - ref| <= 1e-5 * (1 + |ref|). What this cannot check:
// the device's expf (2 ulp there, the host's here) and the float4 loads' alignment faults.
#include "host_emulation/prelude.h"

#include "silu_and_mul/silu_and_mul_kernel.cuh"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(SiluAndMulEmulationKernelTest, MatchesReferenceBackend) {
  auto reference = backend::CreateReferenceBackend();
  for (int64_t inter : {1, 4, 257, 1024, 1027, 1028}) {
    for (int64_t tokens : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "I " << inter << " T " << tokens);
      std::vector<float> gate_up =
          emulation_test::RandomNormal(static_cast<size_t>(tokens * 2 * inter), static_cast<uint32_t>(inter), 4.f);
      gate_up[0] = 30.f;
      if (inter > 1) gate_up[1] = -30.f;
      std::vector<float> out(static_cast<size_t>(tokens * inter)), ref(out.size());
      host_emulation::EmulateGrid(silu_and_mul::SiluAndMulGrid(tokens, inter), silu_and_mul::kThreads,
                                  [&] { silu_and_mul::SiluAndMulKernel(gate_up.data(), inter, out.data()); });
      reference->SiluAndMul(TensorView::Contiguous(gate_up.data(), DType::kF32, {tokens, 2 * inter}),
                            TensorView::Contiguous(ref.data(), DType::kF32, {tokens, inter}));
      emulation_test::ExpectRelativelyClose(out, ref, 1e-5f);
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
