// The CUDA block copy against kv::KvStorage::CopyBlock: a pool of random bytes, a list of
// (src, dst) pairs (one src == dst, one src copied to two dsts), every layer at once, and
// one layer alone; the pool must come back byte for byte as CopyBlock leaves the host copy.
// Pools whose block size is not a multiple of 16 bytes take the byte-wise path.
// Skips where no GPU is present (CI), saying why.
#include "copy_blocks/copy_blocks.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

struct CopyCase {
  int32_t num_layers, kv_heads, head_dim, block_size;
  DType dtype;
};

TEST(CopyBlocksKernelTest, MatchesKvStorageCopyBlock) {
  KVMESH_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> pairs = {3, 0, 5, 5, 1, 6, 1, 7, 9, 2};  // (src, dst) ...
  for (const CopyCase& c : {CopyCase{3, 2, 64, 16, DType::kBF16}, CopyCase{2, 8, 128, 16, DType::kF32},
                            CopyCase{1, 1, 3, 5, DType::kBF16}}) {  // the last: 60-byte blocks
    SCOPED_TRACE(::testing::Message() << "layers " << c.num_layers << " Hkv " << c.kv_heads << " D " << c.head_dim
                                      << " B " << c.block_size);
    auto storage = kv::KvStorage::Create({.num_layers = c.num_layers,
                                          .num_kv_heads = c.kv_heads,
                                          .head_dim = c.head_dim,
                                          .block_size_tokens = c.block_size,
                                          .dtype = c.dtype,
                                          .num_blocks = 10})
                       .value();
    const kv::KvLayout& layout = storage->layout();
    std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 10 + c.num_layers));
    for (int64_t i = 0; i < storage->size_bytes(); ++i) storage->data()[i] = static_cast<std::byte>(rng());
    const std::vector<std::byte> initial(storage->data(), storage->data() + storage->size_bytes());
    DeviceBuffer<int32_t> dpairs(pairs);
    const int64_t num_pairs = static_cast<int64_t>(pairs.size() / 2);

    // Every layer in one launch.
    DeviceBuffer<std::byte> dpool(initial);
    ASSERT_EQ(LaunchCopyBlocks(dpool.get(),
                               {.num_layers = c.num_layers,
                                .layer_bytes = layout.LayerBytes(),
                                .block_bytes = layout.BlockBytes()},
                               dpairs.get(), num_pairs, nullptr),
              cudaSuccess);
    const std::vector<std::byte> gpu = dpool.Download();
    for (size_t p = 0; p < pairs.size(); p += 2) {
      ASSERT_TRUE(storage->CopyBlock(kv::BlockId{pairs[p]}, kv::BlockId{pairs[p + 1]}).ok());
    }
    ASSERT_EQ(std::memcmp(gpu.data(), storage->data(), gpu.size()), 0) << "pool bytes differ";

    // The last layer alone: the others stay as they were.
    const int32_t last = c.num_layers - 1;
    DeviceBuffer<std::byte> dpool2(initial);
    const BlockPoolShape one_layer{.num_layers = 1, .layer_bytes = layout.LayerBytes(),
                                   .block_bytes = layout.BlockBytes()};
    ASSERT_EQ(LaunchCopyBlocks(dpool2.get() + layout.BlockOffset(last, kv::BlockId{0}), one_layer, dpairs.get(),
                               num_pairs, nullptr),
              cudaSuccess);
    const std::vector<std::byte> gpu2 = dpool2.Download();
    const size_t last_at = static_cast<size_t>(layout.BlockOffset(last, kv::BlockId{0}));
    ASSERT_EQ(std::memcmp(gpu2.data(), initial.data(), last_at), 0) << "an earlier layer changed";
    ASSERT_EQ(std::memcmp(gpu2.data() + last_at, storage->data() + last_at, gpu2.size() - last_at), 0)
        << "the last layer differs from CopyBlock's";
  }
}

TEST(CopyBlocksKernelTest, RejectsBadShapes) {
  // Argument checks happen before any launch, so they hold without a GPU too.
  EXPECT_EQ(LaunchCopyBlocks(nullptr, {.num_layers = 0, .layer_bytes = 64, .block_bytes = 32}, nullptr, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchCopyBlocks(nullptr, {.num_layers = 1, .layer_bytes = 64, .block_bytes = 0}, nullptr, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchCopyBlocks(nullptr, {.num_layers = 1, .layer_bytes = 64, .block_bytes = 32}, nullptr, 0, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace kvmesh::kernels
