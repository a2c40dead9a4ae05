// The block-copy kernel's own code (copy_blocks_kernel.cuh) on the host emulation, with the
// launcher's grid and its choice of copy unit, against kv::KvStorage::CopyBlock, as
// copy_blocks_test: a pool of random bytes, (src, dst) pairs with one src == dst and one src
// copied to two dsts, every layer at once and the last layer alone; 16-byte units where the
// blocks allow, bytes for 60-byte blocks. Byte for byte.
#include "host_emulation/prelude.h"

#include "copy_blocks/copy_blocks_kernel.cuh"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

struct CopyCase {
  int32_t num_layers, kv_heads, head_dim, block_size;
  DType dtype;
  bool wide;  // the launcher copies in 16-byte units
};

// What LaunchCopyBlocks(pool, shape, pairs) would launch, on the host.
void EmulateCopy(std::byte* pool, const BlockPoolShape& shape, const std::vector<int32_t>& pairs) {
  char* base = reinterpret_cast<char*>(pool);
  const int64_t num_pairs = static_cast<int64_t>(pairs.size() / 2);
  const bool wide = copy_blocks::CopiesInUint4(pool, shape);
  host_emulation::EmulateGrid(copy_blocks::CopyBlocksGrid(num_pairs, shape), copy_blocks::kThreads, [&] {
    wide ? copy_blocks::CopyBlocksKernel<uint4>(base, shape, pairs.data())
         : copy_blocks::CopyBlocksKernel<unsigned char>(base, shape, pairs.data());
  });
}

TEST(CopyBlocksEmulationKernelTest, MatchesKvStorageCopyBlock) {
  const std::vector<int32_t> pairs = {3, 0, 5, 5, 1, 6, 1, 7, 9, 2};  // (src, dst) ...
  for (const CopyCase& c : {CopyCase{3, 2, 8, 4, DType::kBF16, true}, CopyCase{2, 1, 16, 5, DType::kF32, true},
                            CopyCase{1, 1, 3, 5, DType::kBF16, false}}) {  // the last: 60-byte blocks
    SCOPED_TRACE(::testing::Message() << "layers " << c.num_layers << " Hkv " << c.kv_heads << " D " << c.head_dim
                                      << " B " << c.block_size);
    std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 10 + c.num_layers));
    const std::unique_ptr<kv::KvStorage> storage = emulation_test::RandomKvStorage(
        {.num_layers = c.num_layers, .num_kv_heads = c.kv_heads, .head_dim = c.head_dim,
         .block_size_tokens = c.block_size, .dtype = c.dtype, .num_blocks = 10},
        rng);
    const kv::KvLayout& layout = storage->layout();
    const std::vector<std::byte> initial(storage->data(), storage->data() + storage->size_bytes());

    // Every layer in one launch, on a copy (new[]'s 16-byte alignment, as cudaMalloc's).
    std::vector<std::byte> pool = initial;
    const BlockPoolShape all_layers{
        .num_layers = c.num_layers, .layer_bytes = layout.LayerBytes(), .block_bytes = layout.BlockBytes()};
    ASSERT_EQ(copy_blocks::CopiesInUint4(pool.data(), all_layers), c.wide);
    EmulateCopy(pool.data(), all_layers, pairs);
    for (size_t p = 0; p < pairs.size(); p += 2) {
      ASSERT_TRUE(storage->CopyBlock(kv::BlockId{pairs[p]}, kv::BlockId{pairs[p + 1]}).ok());
    }
    ASSERT_EQ(std::memcmp(pool.data(), storage->data(), pool.size()), 0) << "pool bytes differ";

    // The last layer alone: the others stay as they were.
    const int32_t last = c.num_layers - 1;
    const size_t last_at = static_cast<size_t>(layout.BlockOffset(last, kv::BlockId{0}));
    std::vector<std::byte> pool2 = initial;
    EmulateCopy(pool2.data() + last_at,
                {.num_layers = 1, .layer_bytes = layout.LayerBytes(), .block_bytes = layout.BlockBytes()}, pairs);
    ASSERT_EQ(std::memcmp(pool2.data(), initial.data(), last_at), 0) << "an earlier layer changed";
    ASSERT_EQ(std::memcmp(pool2.data() + last_at, storage->data() + last_at, pool2.size() - last_at), 0)
        << "the last layer differs from CopyBlock's";
  }
}

}  // namespace
}  // namespace kvmesh::kernels
