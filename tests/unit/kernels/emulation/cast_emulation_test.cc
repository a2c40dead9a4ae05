// The f32 -> bf16 / f16 cast kernel's own code (cast_kernel.cuh) on the host emulation, with
// the launcher's grid, against core/dtype.h's F32ToBf16 / F32ToF16, bit for bit: random
// values plus ties, infinities, NaNs with payloads, subnormals and values beyond f16's range.
// One exception: an f16 NaN only has to be a NaN. __float2half_rn gives the canonical 0x7fff
// (as the device's cvt.rn.f16.f32 does), F32ToF16 keeps the sign with 0x7e00; nothing reads
// a NaN's bits.
// What this cannot check: the grid-stride loop beyond the launcher's 4096-block cap (that
// takes a million threads); n is small enough that each thread converts one element at most.
#include "host_emulation/prelude.h"

#include "cast/cast_kernel.cuh"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(CastEmulationKernelTest, MatchesHostConversionsBitForBit) {
  std::vector<float> in = emulation_test::RandomNormal(300, 9, 1000.f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {0.f, -0.f, inf, -inf, std::bit_cast<float>(0x7fa00001u),
                                      std::bit_cast<float>(0xffc00001u), std::bit_cast<float>(0x3f808000u),
                                      std::bit_cast<float>(0x3f818000u), 1e-30f, -1e-41f, 65504.f, 65520.f, 1e6f,
                                      std::bit_cast<float>(0x33800000u), std::numeric_limits<float>::max()};
  for (size_t i = 0; i < special.size(); ++i) in[i * 17] = special[i];
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    const int64_t n = static_cast<int64_t>(in.size());
    std::vector<uint16_t> out(in.size(), 0xdead);
    host_emulation::EmulateGrid(cast::CastGrid(n), cast::kThreads, [&] {
      bf16 ? cast::CastKernel<true>(in.data(), n, out.data()) : cast::CastKernel<false>(in.data(), n, out.data());
    });
    for (size_t i = 0; i < in.size(); ++i) {
      if (!bf16 && std::isnan(in[i])) {
        ASSERT_TRUE((out[i] & 0x7c00u) == 0x7c00u && (out[i] & 0x03ffu) != 0) << "not an f16 NaN at " << i;
        continue;
      }
      ASSERT_EQ(out[i], bf16 ? F32ToBf16(in[i]) : F32ToF16(in[i])) << "x " << in[i] << " at " << i;
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
