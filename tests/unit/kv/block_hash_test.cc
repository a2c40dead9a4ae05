#include "kv/block_hash.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

std::vector<int32_t> Iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockHashTest, IsDeterministicAcrossProcesses) {
  // Golden value, computed independently: one-shot XXH3-128 over the 32-byte header
  // {parent.low, parent.high, salt, 16} followed by the tokens. The scheduler's global
  // index compares hashes from many processes, so a change of the hash function must be
  // deliberate (and invalidates every stored index).
  const std::vector<int32_t> tokens = Iota(16);
  const BlockHash h = HashBlock(kRootBlockHash, tokens, /*salt=*/7);
  EXPECT_EQ(h, HashBlock(kRootBlockHash, tokens, 7));
  EXPECT_EQ(h.ToHex(), "84ef0d276da1f25703d41a1579877991");
}

TEST(BlockHashTest, DependsOnParentSaltAndEveryToken) {
  const std::vector<int32_t> tokens = Iota(16);
  const BlockHash base = HashBlock(kRootBlockHash, tokens, 0);
  EXPECT_NE(HashBlock(BlockHash{.low = 1, .high = 0}, tokens, 0), base);
  EXPECT_NE(HashBlock(kRootBlockHash, tokens, 1), base);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> changed = tokens;
    changed[i] += 1;
    EXPECT_NE(HashBlock(kRootBlockHash, changed, 0), base) << i;
  }
  // A shorter block with the same leading tokens is a different block.
  EXPECT_NE(HashBlock(kRootBlockHash, std::span<const int32_t>(tokens).first(15), 0), base);
}

TEST(BlockHashTest, HashesOnlyFullBlocksChainedFromTheRoot) {
  const std::vector<int32_t> tokens = Iota(50);
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens, 16, 3);
  ASSERT_EQ(hashes.size(), 3u);  // the 2 trailing tokens are a partial block
  const std::span<const int32_t> t(tokens);
  EXPECT_EQ(hashes[0], HashBlock(kRootBlockHash, t.subspan(0, 16), 3));
  EXPECT_EQ(hashes[1], HashBlock(hashes[0], t.subspan(16, 16), 3));
  EXPECT_EQ(hashes[2], HashBlock(hashes[1], t.subspan(32, 16), 3));
  EXPECT_TRUE(HashFullBlocks(t.first(15), 16, 3).empty());
  EXPECT_TRUE(HashFullBlocks(tokens, 0, 3).empty());
}

TEST(BlockHashTest, EqualBlocksAfterDifferentPrefixesDiffer) {
  // Blocks 1 are identical token-wise, but their prefixes differ: no sharing.
  std::vector<int32_t> a = Iota(32);
  std::vector<int32_t> b = a;
  b[0] = 999;
  const auto ha = HashFullBlocks(a, 16, 0);
  const auto hb = HashFullBlocks(b, 16, 0);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  // A change in block 1 leaves block 0's hash alone.
  std::vector<int32_t> c = a;
  c[20] = 999;
  const auto hc = HashFullBlocks(c, 16, 0);
  EXPECT_EQ(ha[0], hc[0]);
  EXPECT_NE(ha[1], hc[1]);
}

TEST(BlockHashTest, SaltSeparatesModels) {
  const std::vector<int32_t> tokens = Iota(64);
  const auto model_a = HashFullBlocks(tokens, 16, /*salt=*/0x1111);
  const auto model_b = HashFullBlocks(tokens, 16, /*salt=*/0x2222);
  ASSERT_EQ(model_a.size(), model_b.size());
  for (size_t i = 0; i < model_a.size(); ++i) EXPECT_NE(model_a[i], model_b[i]) << i;
}

TEST(BlockHashTest, ExtendHashesOnlyNewFullBlocks) {
  const std::vector<int32_t> tokens = Iota(100, 5);
  const std::span<const int32_t> t(tokens);
  std::vector<BlockHash> incremental;
  for (size_t n = 0; n <= tokens.size(); ++n) {
    ExtendBlockHashes(t.first(n), 8, 42, &incremental);
    ASSERT_EQ(incremental.size(), n / 8);
  }
  EXPECT_EQ(incremental, HashFullBlocks(tokens, 8, 42));
  // Already ahead of the tokens: nothing changes.
  ExtendBlockHashes(t.first(10), 8, 42, &incremental);
  EXPECT_EQ(incremental.size(), 12u);
}

TEST(BlockHashTest, CacheSaltChangesEveryBlockAndNoSaltChangesNothing) {
  const std::vector<int32_t> tokens = Iota(64);
  const std::span<const int32_t> t(tokens);
  const auto plain = HashFullBlocks(tokens, 16, 3);
  // No salt is the chain from kRootBlockHash, exactly as before the field existed.
  EXPECT_EQ(HashFullBlocks(tokens, 16, 3, ""), plain);
  EXPECT_EQ(CacheSaltRoot(""), kRootBlockHash);
  EXPECT_EQ(plain[0], HashBlock(kRootBlockHash, t.subspan(0, 16), 3));

  const auto tenant_a = HashFullBlocks(tokens, 16, 3, "tenant-a");
  const auto tenant_b = HashFullBlocks(tokens, 16, 3, "tenant-b");
  ASSERT_EQ(tenant_a.size(), plain.size());
  ASSERT_EQ(tenant_b.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NE(tenant_a[i], plain[i]) << i;
    EXPECT_NE(tenant_b[i], plain[i]) << i;
    EXPECT_NE(tenant_a[i], tenant_b[i]) << i;
  }
  // The salt enters the first block only (its root); later blocks differ by chaining.
  EXPECT_EQ(tenant_a[0], HashBlock(CacheSaltRoot("tenant-a"), t.subspan(0, 16), 3));
  EXPECT_EQ(tenant_a[1], HashBlock(tenant_a[0], t.subspan(16, 16), 3));
  EXPECT_EQ(HashFullBlocks(tokens, 16, 3, "tenant-a"), tenant_a);
}

TEST(BlockHashTest, ExtendWithCacheSaltMatchesHashingAtOnce) {
  const std::vector<int32_t> tokens = Iota(40);
  const std::span<const int32_t> t(tokens);
  std::vector<BlockHash> incremental;
  for (size_t n = 0; n <= tokens.size(); ++n) ExtendBlockHashes(t.first(n), 8, 0, &incremental, "s");
  EXPECT_EQ(incremental, HashFullBlocks(tokens, 8, 0, "s"));
}

}  // namespace
}  // namespace kvmesh::kv
