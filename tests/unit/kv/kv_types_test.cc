#include "kv/kv_types.h"

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

namespace kvmesh::kv {
namespace {

TEST(KvTypesTest, StrongIdsCompareAndHashByValue) {
  EXPECT_LT(BlockId{1}, BlockId{2});
  EXPECT_EQ(BlockId{3}, BlockId{3});
  EXPECT_EQ(BlockId{}.value, -1);
  absl::flat_hash_set<BlockId> blocks = {BlockId{1}, BlockId{2}, BlockId{1}};
  EXPECT_EQ(blocks.size(), 2u);
  absl::flat_hash_set<RequestId> requests = {RequestId{int64_t{1} << 40}, RequestId{1}};
  EXPECT_EQ(requests.size(), 2u);
  EXPECT_TRUE(requests.contains(RequestId{int64_t{1} << 40}));
}

TEST(KvTypesTest, BlockHashHexIsHighWordFirst) {
  const BlockHash h{.low = 0x1, .high = 0xabcdef0123456789ull};
  EXPECT_EQ(h.ToHex(), "abcdef01234567890000000000000001");
  EXPECT_EQ(kRootBlockHash.ToHex(), std::string(32, '0'));
  absl::flat_hash_set<BlockHash> set = {h, BlockHash{.low = 1, .high = 0}, h};
  EXPECT_EQ(set.size(), 2u);
}

TEST(KvTypesTest, TierNamesAreStable) {
  EXPECT_STREQ(TierName(Tier::kDevice), "device");
  EXPECT_STREQ(TierName(Tier::kHost), "host");
  EXPECT_STREQ(TierName(Tier::kDisk), "disk");
  EXPECT_EQ(kDefaultBlockSizeTokens, 16);
}

}  // namespace
}  // namespace kvmesh::kv
