// Block swap between a device pool and a pinned host pool, both launchers (the one-launch
// kernel and the per-block cudaMemcpyAsync baseline): offload (device -> host) then onboard
// (host -> device) of random bytes with shuffled pairs, two layers, pools of different
// sizes on each side. Every block not a destination must come back unchanged. Skips
// where no GPU is present (CI), saying why.
#include "swap_blocks/swap_blocks.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "swap_blocks_oracle.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;
using test_util::ExpectedAfterSwap;
using test_util::RandomBytes;
using test_util::ShuffledPairs;
using test_util::SwapCase;

// Pinned (page-locked, mapped) host memory from cudaHostAlloc; freed on destruction.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaHostAlloc(&data_, bytes, cudaHostAllocMapped) != cudaSuccess) {
      ADD_FAILURE() << "cudaHostAlloc of " << bytes << " bytes failed";
      data_ = nullptr;
    }
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { cudaFreeHost(data_); }
  std::byte* get() const { return static_cast<std::byte*>(data_); }
  // The pointer a kernel uses (equal to get() under UVA).
  std::byte* device_pointer() const {
    void* p = nullptr;
    if (cudaHostGetDevicePointer(&p, data_, 0) != cudaSuccess) ADD_FAILURE() << "cudaHostGetDevicePointer failed";
    return static_cast<std::byte*>(p);
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

enum class Launcher { kKernel, kMemcpy };

class SwapBlocksKernelTest : public ::testing::TestWithParam<Launcher> {};

TEST_P(SwapBlocksKernelTest, OffloadsAndOnboardsShuffledBlocks) {
  KVMESH_SKIP_WITHOUT_GPU();
  const Launcher launcher = GetParam();
  // 16-byte path (a Llama-like block: 2 * 8 heads * 16 * 128 * 2 bytes, and a small one),
  // and an odd block size that takes the byte path.
  for (const SwapCase& c :
       {SwapCase{65536, 7, 11, 5}, SwapCase{2 * 2 * 5 * 64 * 2, 13, 9, 9}, SwapCase{1000, 6, 4, 3}}) {
    SCOPED_TRACE(::testing::Message() << "block_bytes " << c.block_bytes << " device " << c.device_blocks
                                      << " host " << c.host_blocks);
    std::mt19937 rng(static_cast<uint32_t>(c.block_bytes + c.pairs));
    const auto [device_shape, host_shape, device_initial, host_initial] = test_util::RandomSwapPools(c, rng);
    const auto device_bytes = device_initial.size();
    const auto host_bytes = host_initial.size();
    DeviceBuffer<std::byte> device_pool(device_initial);
    PinnedBuffer host_pool(host_bytes);
    std::memcpy(host_pool.get(), host_initial.data(), host_bytes);

    // Offload: device -> host. The kernel reads its pairs from device memory.
    const std::vector<int32_t> out_pairs = ShuffledPairs(c.pairs, c.device_blocks, c.host_blocks, rng);
    DeviceBuffer<int32_t> out_pairs_device(out_pairs);
    const cudaError_t out_err =
        launcher == Launcher::kKernel
            ? LaunchSwapBlocks(device_pool.get(), host_pool.device_pointer(), device_shape, host_shape,
                               out_pairs_device.get(), c.pairs, nullptr)
            : LaunchSwapBlocksMemcpy(device_pool.get(), host_pool.get(), device_shape, host_shape, out_pairs.data(),
                                     c.pairs, nullptr);
    ASSERT_EQ(out_err, cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<std::byte> host_expected =
        ExpectedAfterSwap(device_initial, device_shape, host_initial, host_shape, out_pairs);
    ASSERT_EQ(std::memcmp(host_pool.get(), host_expected.data(), host_bytes), 0) << "host pool after offload";

    // Onboard: host -> device, into other device blocks. The kernel reads its pairs from
    // mapped pinned host memory this time.
    const std::vector<int32_t> in_pairs = ShuffledPairs(c.pairs, c.host_blocks, c.device_blocks, rng);
    PinnedBuffer in_pairs_pinned(in_pairs.size() * sizeof(int32_t));
    std::memcpy(in_pairs_pinned.get(), in_pairs.data(), in_pairs_pinned.bytes());
    const cudaError_t in_err =
        launcher == Launcher::kKernel
            ? LaunchSwapBlocks(host_pool.device_pointer(), device_pool.get(), host_shape, device_shape,
                               reinterpret_cast<const int32_t*>(in_pairs_pinned.device_pointer()), c.pairs, nullptr)
            : LaunchSwapBlocksMemcpy(host_pool.get(), device_pool.get(), host_shape, device_shape, in_pairs.data(),
                                     c.pairs, nullptr);
    ASSERT_EQ(in_err, cudaSuccess);
    const std::vector<std::byte> device_after = device_pool.Download();
    const std::vector<std::byte> device_expected =
        ExpectedAfterSwap(host_expected, host_shape, device_initial, device_shape, in_pairs);
    for (size_t i = 0; i < device_bytes; ++i) {
      ASSERT_EQ(static_cast<int>(device_after[i]), static_cast<int>(device_expected[i])) << "device pool byte " << i;
    }
    // The host pool is the onboard's source: unchanged by it.
    ASSERT_EQ(std::memcmp(host_pool.get(), host_expected.data(), host_bytes), 0) << "host pool after onboard";
  }
}

INSTANTIATE_TEST_SUITE_P(Launchers, SwapBlocksKernelTest, ::testing::Values(Launcher::kKernel, Launcher::kMemcpy),
                         [](const ::testing::TestParamInfo<Launcher>& info) {
                           return info.param == Launcher::kKernel ? "Kernel" : "Memcpy";
                         });

TEST(SwapBlocksKernelShapeTest, RejectsMismatchedShapesAndBadIds) {
  // Checked before any launch or copy, so these hold without a GPU too.
  const BlockPoolShape a{.num_layers = 2, .layer_bytes = 4096, .block_bytes = 1024};
  const BlockPoolShape fewer_layers{.num_layers = 1, .layer_bytes = 4096, .block_bytes = 1024};
  const BlockPoolShape other_block{.num_layers = 2, .layer_bytes = 4096, .block_bytes = 2048};
  EXPECT_EQ(LaunchSwapBlocks(nullptr, nullptr, a, fewer_layers, nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSwapBlocks(nullptr, nullptr, a, other_block, nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSwapBlocks(nullptr, nullptr, a, a, nullptr, -1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSwapBlocks(nullptr, nullptr, a, a, nullptr, 0, nullptr), cudaSuccess);
  const int32_t out_of_range[] = {0, 1, 4, 0};  // src id 4 of a 4-block layer
  EXPECT_EQ(LaunchSwapBlocksMemcpy(nullptr, nullptr, a, a, out_of_range, 2, nullptr), cudaErrorInvalidValue);
  const int32_t negative[] = {-1, 0};
  EXPECT_EQ(LaunchSwapBlocksMemcpy(nullptr, nullptr, a, a, negative, 1, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvmesh::kernels
