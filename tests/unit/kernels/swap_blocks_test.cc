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

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

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

std::vector<std::byte> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// `n` pairs (src, dst): distinct random src ids below src_blocks, distinct random dst ids
// below dst_blocks.
std::vector<int32_t> ShuffledPairs(int32_t n, int32_t src_blocks, int32_t dst_blocks, std::mt19937& rng) {
  std::vector<int32_t> src(static_cast<size_t>(src_blocks)), dst(static_cast<size_t>(dst_blocks));
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<int32_t> pairs;
  for (int32_t i = 0; i < n; ++i) {
    pairs.push_back(src[static_cast<size_t>(i)]);
    pairs.push_back(dst[static_cast<size_t>(i)]);
  }
  return pairs;
}

// What the swap must leave in `dst`: `dst` with each pair's block copied over, every layer.
std::vector<std::byte> ExpectedAfterSwap(const std::vector<std::byte>& src, const BlockPoolShape& src_shape,
                                         std::vector<std::byte> dst, const BlockPoolShape& dst_shape,
                                         const std::vector<int32_t>& pairs) {
  for (int64_t layer = 0; layer < src_shape.num_layers; ++layer) {
    for (size_t p = 0; p + 1 < pairs.size(); p += 2) {
      std::memcpy(dst.data() + layer * dst_shape.layer_bytes + pairs[p + 1] * dst_shape.block_bytes,
                  src.data() + layer * src_shape.layer_bytes + pairs[p] * src_shape.block_bytes,
                  static_cast<size_t>(src_shape.block_bytes));
    }
  }
  return dst;
}

enum class Launcher { kKernel, kMemcpy };

class SwapBlocksKernelTest : public ::testing::TestWithParam<Launcher> {};

TEST_P(SwapBlocksKernelTest, OffloadsAndOnboardsShuffledBlocks) {
  KVMESH_SKIP_WITHOUT_GPU();
  const Launcher launcher = GetParam();
  struct Case {
    int64_t block_bytes;
    int32_t device_blocks, host_blocks, pairs;
  };
  // 16-byte path (a Llama-like block: 2 * 8 heads * 16 * 128 * 2 bytes, and a small one),
  // and an odd block size that takes the byte path.
  for (const Case& c : {Case{65536, 7, 11, 5}, Case{2 * 2 * 5 * 64 * 2, 13, 9, 9}, Case{1000, 6, 4, 3}}) {
    SCOPED_TRACE(::testing::Message() << "block_bytes " << c.block_bytes << " device " << c.device_blocks
                                      << " host " << c.host_blocks);
    std::mt19937 rng(static_cast<uint32_t>(c.block_bytes + c.pairs));
    const BlockPoolShape device_shape{.num_layers = 2, .layer_bytes = c.block_bytes * c.device_blocks,
                                      .block_bytes = c.block_bytes};
    const BlockPoolShape host_shape{.num_layers = 2, .layer_bytes = c.block_bytes * c.host_blocks,
                                    .block_bytes = c.block_bytes};
    const auto device_bytes = static_cast<size_t>(2 * device_shape.layer_bytes);
    const auto host_bytes = static_cast<size_t>(2 * host_shape.layer_bytes);
    const std::vector<std::byte> device_initial = RandomBytes(device_bytes, rng);
    const std::vector<std::byte> host_initial = RandomBytes(host_bytes, rng);
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
