#include "kv/kv_layout.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kv/checksum.h"

namespace kvmesh::kv {
namespace {

// 3 layers, 2 KV heads, 4-token blocks, head_dim 8, f32: a block of one layer is
// 2 * 2 * 4 * 8 * 4 = 512 bytes.
KvLayoutOptions SmallShape() {
  return {.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size_tokens = 4, .dtype = DType::kF32,
          .num_blocks = 5};
}

TEST(KvLayoutTest, OneBlockOfOneLayerIsOneContiguousRange) {
  const KvLayout layout = KvLayout::Create(SmallShape()).value();
  EXPECT_EQ(layout.BlockBytes(), 512);
  EXPECT_EQ(layout.LayerBytes(), 5 * 512);
  EXPECT_EQ(layout.TotalBytes(), 3 * 5 * 512);
  EXPECT_EQ(layout.BytesPerToken(), 3 * 512 / 4);
  EXPECT_EQ(layout.BlockOffset(0, BlockId{0}), 0);
  EXPECT_EQ(layout.BlockOffset(0, BlockId{3}), 3 * 512);
  EXPECT_EQ(layout.BlockOffset(2, BlockId{1}), 2 * 5 * 512 + 512);
  // Within a block: [2 (K, V)][heads], K as [head_dim][tokens], V as [tokens][head_dim].
  const int64_t slot = 3 * 4 + 2;  // block 3, offset 2
  EXPECT_EQ(layout.SlotOffset(1, 0, 0, slot), layout.BlockOffset(1, BlockId{3}) + 2 * 4);
  EXPECT_EQ(layout.SlotOffset(1, 0, 1, slot), layout.BlockOffset(1, BlockId{3}) + (1 * 4 * 8 + 2) * 4);
  EXPECT_EQ(layout.SlotOffset(1, 1, 1, slot),
            layout.BlockOffset(1, BlockId{3}) + ((1 * 2 + 1) * 4 + 2) * 8 * 4);
  // Every (kv, head, offset) of a block lies inside that block's range.
  for (int kv = 0; kv < 2; ++kv) {
    for (int h = 0; h < 2; ++h) {
      for (int o = 0; o < 4; ++o) {
        const int64_t off = layout.SlotOffset(2, kv, h, 4 * 4 + o);
        const int64_t last = off + (kv == 0 ? 7 * 4 * 4 : 7 * 4);  // dimension 7
        EXPECT_GE(off, layout.BlockOffset(2, BlockId{4}));
        EXPECT_LE(last + 4, layout.BlockOffset(2, BlockId{4}) + layout.BlockBytes());
      }
    }
  }
}

TEST(KvLayoutTest, SizesFromAByteBudget) {
  KvLayoutOptions o = SmallShape();
  o.num_blocks = 0;
  o.budget_bytes = 3 * 512 * 7 + 100;  // 7 blocks across 3 layers, and change
  EXPECT_EQ(KvLayout::Create(o).value().num_blocks(), 7);
  EXPECT_EQ(NumBlocksForBudget(o, o.budget_bytes), 7);
  EXPECT_EQ(NumBlocksForBudget(o, 3 * 512 - 1), 0);
  EXPECT_EQ(KvBlockBytes(o), 512);
  o.dtype = DType::kFP8E4M3;
  EXPECT_EQ(KvBlockBytes(o), 128);
  EXPECT_EQ(KvLayout::Create(o).value().num_blocks(), 28);  // 4x the blocks at 1 byte
  // Llama-3-8B-like: 32 layers, 8 KV heads, head_dim 128, bf16, 16-token blocks: 64 KiB
  // per block and layer, 2 MiB per block over all layers (128 KiB per token).
  const KvLayoutOptions llama{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .dtype = DType::kBF16};
  EXPECT_EQ(KvBlockBytes(llama), 2 * 8 * 16 * 128 * 2);
  EXPECT_EQ(NumBlocksForBudget(llama, int64_t{40} << 30), 20480);
}

TEST(KvLayoutTest, RejectsABudgetBelowOneBlockPerLayerWithTheNumbers) {
  KvLayoutOptions o = SmallShape();
  o.num_blocks = 0;
  o.budget_bytes = 1000;
  const absl::Status s = KvLayout::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1000 bytes"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("512 bytes"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("1536 bytes"), absl::string_view::npos) << s;
  EXPECT_EQ(KvStorage::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvLayoutTest, RejectsBadShapes) {
  KvLayoutOptions o = SmallShape();
  o.budget_bytes = 1 << 20;  // and num_blocks: both set
  EXPECT_EQ(KvLayout::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallShape();
  o.num_blocks = 0;  // neither set
  EXPECT_EQ(KvLayout::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallShape();
  o.head_dim = 0;
  EXPECT_EQ(KvLayout::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallShape();
  o.dtype = DType::kInt64;
  EXPECT_EQ(KvLayout::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallShape();
  o.num_blocks = 1 << 30;
  o.num_layers = 1 << 30;  // overflows int64
  EXPECT_EQ(KvLayout::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvLayoutTest, ReplicatedKvHeadsShowInTheAccountingNotInTheSize) {
  KvLayoutOptions shape = SmallShape();
  const KvLayout plain = KvLayout::Create(shape).value();
  EXPECT_EQ(plain.kv_head_replication(), 1);
  EXPECT_EQ(plain.UniqueBytes(), plain.TotalBytes());
  shape.kv_head_replication = 4;  // e.g. 2 KV heads over 8 tensor-parallel ranks
  const KvLayout replicated = KvLayout::Create(shape).value();
  EXPECT_EQ(replicated.TotalBytes(), plain.TotalBytes());
  EXPECT_EQ(replicated.UniqueBytes() * 4, plain.TotalBytes());
  shape.kv_head_replication = 0;
  EXPECT_EQ(KvLayout::Create(shape).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStorageTest, IsAlignedZeroedAndViewedPerLayer) {
  auto storage = KvStorage::Create(SmallShape()).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(storage->data()) % 64, 0u);
  EXPECT_EQ(storage->size_bytes(), 3 * 5 * 512);
  for (int64_t i = 0; i < storage->size_bytes(); ++i) ASSERT_EQ(storage->data()[i], std::byte{0});
  const TensorView v = storage->LayerView(1);
  ASSERT_EQ(v.rank, 5);
  EXPECT_EQ(v.dim(0), 5);
  EXPECT_EQ(v.dim(1), 2);
  EXPECT_EQ(v.dim(2), 2);
  EXPECT_EQ(v.dim(3), 4);
  EXPECT_EQ(v.dim(4), 8);
  EXPECT_EQ(v.num_bytes(), storage->layout().LayerBytes());
  EXPECT_EQ(static_cast<std::byte*>(v.data), storage->data() + storage->layout().BlockOffset(1, BlockId{0}));
  // The view's strides agree with SlotOffset: V, head 1, block 2, offset 3, dim 5.
  float* p = v.data_as<float>() + 2 * v.strides[0] + 1 * v.strides[1] + 1 * v.strides[2] + 3 * v.strides[3] + 5;
  EXPECT_EQ(reinterpret_cast<std::byte*>(p),
            storage->data() + storage->layout().SlotOffset(1, 1, 1, 2 * 4 + 3) + 5 * sizeof(float));
}

TEST(KvStorageTest, CopyBlockCopiesEveryLayerAndNothingElse) {
  auto storage = KvStorage::Create(SmallShape()).value();
  const KvLayout& layout = storage->layout();
  for (int32_t l = 0; l < 3; ++l) {
    for (int32_t b = 0; b < 5; ++b) {
      std::span<std::byte> bytes = storage->BlockData(l, BlockId{b});
      ASSERT_EQ(static_cast<int64_t>(bytes.size()), layout.BlockBytes());
      std::memset(bytes.data(), 10 * l + b, bytes.size());
    }
  }
  ASSERT_TRUE(storage->CopyBlock(BlockId{1}, BlockId{3}).ok());
  for (int32_t l = 0; l < 3; ++l) {
    for (int32_t b = 0; b < 5; ++b) {
      const int expected = 10 * l + (b == 3 ? 1 : b);
      for (std::byte x : storage->BlockData(l, BlockId{b})) ASSERT_EQ(static_cast<int>(x), expected) << l << " " << b;
    }
  }
  EXPECT_TRUE(storage->CopyBlock(BlockId{2}, BlockId{2}).ok());
  EXPECT_EQ(storage->CopyBlock(BlockId{0}, BlockId{5}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(storage->CopyBlock(BlockId{-1}, BlockId{0}).code(), absl::StatusCode::kInvalidArgument);
}


// Every byte of block b in layer l is 10 * l + b.
void FillBlocks(KvStorage& storage) {
  for (int32_t l = 0; l < storage.layout().num_layers(); ++l) {
    for (int32_t b = 0; b < storage.layout().num_blocks(); ++b) {
      std::span<std::byte> bytes = storage.BlockData(l, BlockId{b});
      std::memset(bytes.data(), 10 * l + b, bytes.size());
    }
  }
}

TEST(KvStorageTest, SwapOutOfABatchWritesEachBlockLayerMajorToItsHostRange) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  const int64_t swap = storage->SwapBytesPerBlock();
  ASSERT_EQ(swap, 3 * 512);
  alignas(64) std::byte host[3][3 * 512] = {};
  // Scattered, out of order: blocks 4, 0, 2.
  const std::vector<KvHostCopy> copies = {{BlockId{4}, host[0]}, {BlockId{0}, host[1]}, {BlockId{2}, host[2]}};
  ASSERT_TRUE(storage->SwapOut(copies).ok());
  const int blocks[3] = {4, 0, 2};
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < swap; ++i) {
      ASSERT_EQ(static_cast<int>(host[c][i]), 10 * (i / 512) + blocks[c]) << c << " " << i;
    }
  }
}

TEST(KvStorageTest, SwapOutHashesEachHostRangeAsItCopiesIt) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  alignas(64) std::byte host[2][3 * 512] = {};
  const std::vector<KvHostCopy> copies = {{BlockId{4}, host[0]}, {BlockId{1}, host[1]}};
  std::vector<uint64_t> checksums(2, 0);
  ASSERT_TRUE(storage->SwapOut(copies, checksums).ok());
  EXPECT_EQ(checksums[0], Checksum({host[0], sizeof(host[0])}));
  EXPECT_EQ(checksums[1], Checksum({host[1], sizeof(host[1])}));
  EXPECT_NE(checksums[0], checksums[1]);
  std::vector<uint64_t> too_few(1, 0);
  EXPECT_EQ(storage->SwapOut(copies, too_few).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStorageTest, SwapInHashesEachHostRangeAsItCopiesIt) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  alignas(64) std::byte host[2][3 * 512];
  for (int c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < 3 * 512; ++i) host[c][i] = static_cast<std::byte>(7 * c + i % 13);
  }
  const std::vector<KvHostCopy> copies = {{BlockId{2}, host[0]}, {BlockId{0}, host[1]}};
  std::vector<uint64_t> checksums(2, 0);
  ASSERT_TRUE(storage->SwapIn(copies, checksums, 2).ok());
  EXPECT_EQ(checksums[0], Checksum({host[0], sizeof(host[0])}));
  EXPECT_EQ(checksums[1], Checksum({host[1], sizeof(host[1])}));
  EXPECT_NE(checksums[0], checksums[1]);
  EXPECT_EQ(static_cast<int>(storage->BlockData(1, BlockId{2})[5]), 7 * 0 + (512 + 5) % 13);
  std::vector<uint64_t> too_many(3, 0);
  EXPECT_EQ(storage->SwapIn(copies, too_many).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStorageTest, SwapInOfABatchRestoresEachBlockAndTouchesNoOther) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  alignas(64) std::byte host[2][3 * 512];
  for (int c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < 3 * 512; ++i) host[c][i] = static_cast<std::byte>(100 + 10 * c + i / 512);
  }
  const std::vector<KvHostCopy> copies = {{BlockId{3}, host[0]}, {BlockId{1}, host[1]}};
  ASSERT_TRUE(storage->SwapIn(copies).ok());
  for (int32_t l = 0; l < 3; ++l) {
    for (int32_t b = 0; b < 5; ++b) {
      const int expected = b == 3 ? 100 + l : b == 1 ? 110 + l : 10 * l + b;
      for (std::byte x : storage->BlockData(l, BlockId{b})) ASSERT_EQ(static_cast<int>(x), expected) << l << " " << b;
    }
  }
}

TEST(KvStorageTest, SwapsSplitOverThreadsMoveTheSameBytesAndChecksumsAsOneThread) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  // 5 copies over 3 threads (shares of 1, 2 and 2) and over more threads than copies.
  alignas(64) std::byte one[5][3 * 512] = {};
  alignas(64) std::byte split[5][3 * 512] = {};
  const int order[5] = {4, 0, 3, 1, 2};
  for (int threads : {3, 8}) {
    std::vector<KvHostCopy> serial, parallel;
    for (int c = 0; c < 5; ++c) {
      serial.push_back({BlockId{order[c]}, one[c]});
      parallel.push_back({BlockId{order[c]}, split[c]});
    }
    std::memset(split, 0, sizeof(split));
    std::vector<uint64_t> serial_sums(5, 0), parallel_sums(5, 0);
    ASSERT_TRUE(storage->SwapOut(serial, serial_sums).ok());
    ASSERT_TRUE(storage->SwapOut(parallel, parallel_sums, threads).ok());
    EXPECT_EQ(std::memcmp(one, split, sizeof(one)), 0) << threads;
    EXPECT_EQ(serial_sums, parallel_sums) << threads;
    // Back in, onto other blocks (reversed), on the same thread count.
    for (int c = 0; c < 5; ++c) {
      for (int64_t i = 0; i < 3 * 512; ++i) split[c][i] = static_cast<std::byte>(50 + 10 * c + i / 512);
      parallel[c].block = BlockId{4 - c};
    }
    ASSERT_TRUE(storage->SwapIn(parallel, {}, threads).ok());
    for (int c = 0; c < 5; ++c) {
      for (int32_t l = 0; l < 3; ++l) {
        for (std::byte x : storage->BlockData(l, BlockId{4 - c})) ASSERT_EQ(static_cast<int>(x), 50 + 10 * c + l);
      }
    }
    FillBlocks(*storage);
  }
}

TEST(KvStorageTest, ABatchWithABlockOutOfRangeIsRefusedBeforeAnythingIsCopied) {
  auto storage = KvStorage::Create(SmallShape()).value();
  FillBlocks(*storage);
  alignas(64) std::byte host[2][3 * 512] = {};
  const std::vector<KvHostCopy> out = {{BlockId{1}, host[0]}, {BlockId{5}, host[1]}};
  EXPECT_EQ(storage->SwapOut(out).code(), absl::StatusCode::kInvalidArgument);
  for (std::byte x : host[0]) ASSERT_EQ(x, std::byte{0});
  const std::vector<KvHostCopy> in = {{BlockId{1}, host[0]}, {BlockId{-1}, host[1]}};
  EXPECT_EQ(storage->SwapIn(in).code(), absl::StatusCode::kInvalidArgument);
  for (std::byte x : storage->BlockData(0, BlockId{1})) ASSERT_EQ(static_cast<int>(x), 1);
}

}  // namespace
}  // namespace kvmesh::kv
