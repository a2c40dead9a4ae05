#include "kv_store/store_key.h"

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"

namespace kvmesh::kv_store {
namespace {

// NOTE: built in one initializer: assigning short literals to std::string members trips
// GCC 12's -Wrestrict false positive at -O3.
StoreKeyScope BaseScope(std::string model = "smollm2-135m", std::string cache_salt = "") {
  return StoreKeyScope{.model = std::move(model),
                       .block_spec = {.num_layers = 30,
                                      .num_kv_heads = 3,
                                      .head_dim = 64,
                                      .block_size_tokens = 16,
                                      .dtype = DType::kBF16,
                                      .block_bytes = 12288},
                       .tp_rank = 0,
                       .tp_size = 1,
                       .cache_salt = std::move(cache_salt)};
}

constexpr kv::BlockHash kBlock{.low = 0x0123456789abcdefULL, .high = 0xfedcba9876543210ULL};

TEST(StoreKeyTest, IsAPureFunctionOfItsInputs) {
  EXPECT_EQ(DeriveStoreKey(kBlock, BaseScope()), DeriveStoreKey(kBlock, BaseScope()));
  EXPECT_EQ(StoreKeySpace::Create(BaseScope()).value().Key(kBlock), DeriveStoreKey(kBlock, BaseScope()));
}

// A store's contents outlive a build: the derivation may not drift silently. A change
// that means to change it bumps kKvStoreLayoutVersion and this value together.
TEST(StoreKeyTest, IsStableAcrossBuilds) {
  const StoreKey key = DeriveStoreKey(kBlock, BaseScope());
  EXPECT_EQ(key.ToHex(), "34f1e3027577b264d1e56d6695649123") << "got " << key.ToHex();
}

TEST(StoreKeyTest, AnyDifferingFieldGivesAnotherKey) {
  const std::vector<std::function<void(StoreKeyScope&)>> changes = {
      [](StoreKeyScope& s) { s = BaseScope("smollm2-360m"); },
      [](StoreKeyScope& s) { s.block_spec.num_layers = 31; },
      [](StoreKeyScope& s) { s.block_spec.num_kv_heads = 1; },
      [](StoreKeyScope& s) { s.block_spec.head_dim = 128; },
      [](StoreKeyScope& s) { s.block_spec.block_size_tokens = 32; },
      [](StoreKeyScope& s) { s.block_spec.dtype = DType::kFP8E4M3; },
      [](StoreKeyScope& s) { s.block_spec.block_bytes = 6144; },
      [](StoreKeyScope& s) { s.tp_size = 2; },
      [](StoreKeyScope& s) {
        s.tp_size = 2;
        s.tp_rank = 1;
      },
      [](StoreKeyScope& s) { s = BaseScope("smollm2-135m", "tenant-a"); },
      [](StoreKeyScope& s) { s = BaseScope("smollm2-135m", "tenant-b"); },
  };
  std::set<StoreKey> keys = {DeriveStoreKey(kBlock, BaseScope())};
  for (size_t i = 0; i < changes.size(); ++i) {
    StoreKeyScope scope = BaseScope();
    changes[i](scope);
    EXPECT_TRUE(keys.insert(DeriveStoreKey(kBlock, scope)).second) << "change " << i << " collided";
  }
  // And the chained hash itself, either word.
  EXPECT_TRUE(keys.insert(DeriveStoreKey({.low = kBlock.low ^ 1, .high = kBlock.high}, BaseScope())).second);
  EXPECT_TRUE(keys.insert(DeriveStoreKey({.low = kBlock.low, .high = kBlock.high ^ 1}, BaseScope())).second);
}

TEST(StoreKeyTest, StringFieldsCannotBleedIntoEachOther) {
  const StoreKeyScope a = BaseScope("ab", "c");
  const StoreKeyScope b = BaseScope("a", "bc");
  EXPECT_NE(DeriveStoreKey(kBlock, a), DeriveStoreKey(kBlock, b));
}

TEST(StoreKeyTest, CreateRefusesAnInvalidScope) {
  const StoreKeyScope no_model = BaseScope("");
  EXPECT_EQ(StoreKeySpace::Create(no_model).status().code(), absl::StatusCode::kInvalidArgument);
  StoreKeyScope bad_rank = BaseScope();
  bad_rank.tp_rank = 1;  // of tp_size 1
  EXPECT_EQ(StoreKeySpace::Create(bad_rank).status().code(), absl::StatusCode::kInvalidArgument);
  StoreKeyScope bad_layout = BaseScope();
  bad_layout.block_spec.head_dim = 0;
  EXPECT_EQ(StoreKeySpace::Create(bad_layout).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StoreKeyTest, KeysMapsEachHashInOrder) {
  const StoreKeySpace space = StoreKeySpace::Create(BaseScope()).value();
  const std::vector<kv::BlockHash> chain = {kBlock, {.low = 1, .high = 2}};
  const std::vector<StoreKey> keys = space.Keys(chain);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], space.Key(chain[0]));
  EXPECT_EQ(keys[1], space.Key(chain[1]));
}

}  // namespace
}  // namespace kvmesh::kv_store
