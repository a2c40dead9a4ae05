// The block-swap kernel's own code (swap_blocks_kernel.cuh: LaunchSwapBlocks' one launch) on
// the host emulation, with the launcher's grid and choice of copy unit, against
// swap_blocks_test's host oracle (swap_blocks_oracle.h): offload then onboard of random bytes
// with shuffled pairs, two layers, pools of different sizes on each side; 16-byte units with
// the unrolled loop's full rounds and its tail, and bytes for 1000-byte blocks; pairs with
// an id out of range are skipped. Byte for byte; every block not a destination unchanged.
// What this cannot check: the pinned side's memory space (both pools are plain host memory
// here) and the zero-copy reads over the host link (timing, ordering with host access).
#include "host_emulation/prelude.h"

#include "swap_blocks/swap_blocks_kernel.cuh"

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "host_emulation/grid.h"
#include "swap_blocks_oracle.h"

namespace kvmesh::kernels {
namespace {

// What LaunchSwapBlocks(src, dst, ...) would do, on the host (the launcher's checks hold).
void EmulateSwap(const std::vector<std::byte>& src, const BlockPoolShape& src_shape, std::vector<std::byte>& dst,
                 const BlockPoolShape& dst_shape, const std::vector<int32_t>& pairs) {
  const auto* from = reinterpret_cast<const char*>(src.data());
  auto* to = reinterpret_cast<char*>(dst.data());
  const int64_t num_pairs = static_cast<int64_t>(pairs.size() / 2);
  const int64_t src_blocks = src_shape.layer_bytes / src_shape.block_bytes;
  const int64_t dst_blocks = dst_shape.layer_bytes / dst_shape.block_bytes;
  const bool wide = swap_blocks::SwapsInUint4(from, to, src_shape, dst_shape);
  host_emulation::EmulateGrid(swap_blocks::SwapBlocksGrid(num_pairs, src_shape), swap_blocks::kThreads, [&] {
    if (wide) {
      swap_blocks::SwapBlocksKernel<uint4>(from, to, src_shape.layer_bytes, dst_shape.layer_bytes,
                                           src_shape.block_bytes, src_blocks, dst_blocks, pairs.data());
    } else {
      swap_blocks::SwapBlocksKernel<unsigned char>(from, to, src_shape.layer_bytes, dst_shape.layer_bytes,
                                                   src_shape.block_bytes, src_blocks, dst_blocks, pairs.data());
    }
  });
}

TEST(SwapBlocksEmulationKernelTest, OffloadsAndOnboardsShuffledBlocks) {
  // 65536 bytes: 4096 uint4, four full unrolled rounds of 256 x 4; 2560 bytes: 160 uint4, the
  // tail loop only; 1000 bytes: the byte path.
  for (const test_util::SwapCase& c : {test_util::SwapCase{65536, 7, 11, 2}, test_util::SwapCase{2560, 13, 9, 4},
                                       test_util::SwapCase{1000, 6, 4, 3}}) {
    SCOPED_TRACE(::testing::Message() << "block_bytes " << c.block_bytes);
    std::mt19937 rng(static_cast<uint32_t>(c.block_bytes + c.pairs));
    const auto [device_shape, host_shape, device_initial, host_initial] = test_util::RandomSwapPools(c, rng);
    EXPECT_EQ(swap_blocks::SwapsInUint4(device_initial.data(), host_initial.data(), device_shape, host_shape),
              c.block_bytes % 16 == 0);

    // Offload: device -> host.
    std::vector<std::byte> host_pool = host_initial;
    const std::vector<int32_t> out_pairs = test_util::ShuffledPairs(c.pairs, c.device_blocks, c.host_blocks, rng);
    EmulateSwap(device_initial, device_shape, host_pool, host_shape, out_pairs);
    const std::vector<std::byte> host_expected =
        test_util::ExpectedAfterSwap(device_initial, device_shape, host_initial, host_shape, out_pairs);
    ASSERT_EQ(host_pool, host_expected) << "host pool after offload";

    // Onboard: host -> device, into other device blocks.
    std::vector<std::byte> device_pool = device_initial;
    const std::vector<int32_t> in_pairs = test_util::ShuffledPairs(c.pairs, c.host_blocks, c.device_blocks, rng);
    EmulateSwap(host_pool, host_shape, device_pool, device_shape, in_pairs);
    ASSERT_EQ(device_pool, test_util::ExpectedAfterSwap(host_expected, host_shape, device_initial, device_shape,
                                                        in_pairs))
        << "device pool after onboard";
  }
}

TEST(SwapBlocksEmulationKernelTest, SkipsPairsWithAnIdOutOfRange) {
  const BlockPoolShape shape{.num_layers = 2, .layer_bytes = 4 * 64, .block_bytes = 64};
  std::mt19937 rng(3);
  const std::vector<std::byte> src = test_util::RandomBytes(static_cast<size_t>(2 * shape.layer_bytes), rng);
  const std::vector<std::byte> dst_initial = test_util::RandomBytes(src.size(), rng);
  std::vector<std::byte> dst = dst_initial;
  // (4, 0): src past the end; (-1, 1) and (2, 4): out of range; (1, 3): the one valid pair.
  EmulateSwap(src, shape, dst, shape, {4, 0, -1, 1, 2, 4, 1, 3});
  EXPECT_EQ(dst, test_util::ExpectedAfterSwap(src, shape, dst_initial, shape, {1, 3}));
}

}  // namespace
}  // namespace kvmesh::kernels
