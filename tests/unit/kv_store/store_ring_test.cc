#include "kv_store/store_ring.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv_store {
namespace {

constexpr int kKeys = 100'000;

std::vector<StoreKey> RandomKeys(int n) {
  std::mt19937_64 rng(20240601);  // seeded
  std::vector<StoreKey> keys(n);
  for (StoreKey& k : keys) k = StoreKey{.low = rng(), .high = rng()};
  return keys;
}

std::vector<std::string> Addresses(int n, int first = 0) {
  std::vector<std::string> a;
  for (int i = first; i < first + n; ++i) a.push_back(absl::StrCat("10.0.0.", i, ":50070"));
  return a;
}

TEST(StoreRingTest, SpreadsKeysEvenly) {
  const StoreRing ring(Addresses(8), absl::ZeroDuration());
  std::vector<int> count(8, 0);
  for (const StoreKey& k : RandomKeys(kKeys)) ++count[ring.Home(k)];
  for (int c : count) EXPECT_NEAR(c, kKeys / 8, kKeys / 8 * 0.05);
}

TEST(StoreRingTest, HomesDoNotDependOnTheOrderOfTheList) {
  std::vector<std::string> reversed = Addresses(5);
  std::reverse(reversed.begin(), reversed.end());
  const StoreRing a(Addresses(5), absl::ZeroDuration());
  const StoreRing b(reversed, absl::ZeroDuration());
  for (const StoreKey& k : RandomKeys(1000)) EXPECT_EQ(a.address(a.Home(k)), b.address(b.Home(k)));
}

TEST(StoreRingTest, RemovingOneOfNStoresMovesOnlyItsKeys) {
  constexpr int kStores = 10;
  const StoreRing full(Addresses(kStores), absl::ZeroDuration());
  std::vector<std::string> fewer = Addresses(kStores);
  const std::string removed = fewer[3];
  fewer.erase(fewer.begin() + 3);
  const StoreRing less(fewer, absl::ZeroDuration());
  int moved = 0;
  for (const StoreKey& k : RandomKeys(kKeys)) {
    const std::string before = full.address(full.Home(k));
    const std::string after = less.address(less.Home(k));
    if (before == after) continue;
    ++moved;
    EXPECT_EQ(before, removed) << "a key of another store moved";
  }
  EXPECT_NEAR(moved, kKeys / kStores, kKeys / kStores * 0.05);
}

TEST(StoreRingTest, AddingAStoreMovesAboutOneNthOfTheKeysAllToIt) {
  constexpr int kStores = 10;
  const StoreRing before(Addresses(kStores), absl::ZeroDuration());
  const StoreRing after(Addresses(kStores + 1), absl::ZeroDuration());
  const std::string added = Addresses(1, kStores)[0];
  int moved = 0;
  for (const StoreKey& k : RandomKeys(kKeys)) {
    const std::string was = before.address(before.Home(k));
    const std::string is = after.address(after.Home(k));
    if (was == is) continue;
    ++moved;
    EXPECT_EQ(is, added) << "a key moved between old stores";
  }
  EXPECT_NEAR(moved, kKeys / (kStores + 1), kKeys / (kStores + 1) * 0.05);
}

TEST(StoreRingTest, NoStoresMeansNoHome) {
  const StoreRing ring({}, absl::ZeroDuration());
  EXPECT_EQ(ring.Home(StoreKey{.low = 1, .high = 2}), -1);
  EXPECT_EQ(ring.PutTarget(StoreKey{.low = 1, .high = 2}, absl::Now()), -1);
}

// Mooncake #3688: a store that rejoins empty must not take the write-through of its whole
// share at once. During its warm-up it is given a growing fraction of its puts; reads
// (Home) still go to it.
TEST(StoreRingTest, ARestartedStoreIsGivenPutsGradually) {
  constexpr int kStores = 4;
  const absl::Duration warmup = absl::Seconds(40);
  StoreRing ring(Addresses(kStores), warmup);
  const std::vector<StoreKey> keys = RandomKeys(kKeys);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  ring.StartWarmup(2, t0);

  std::vector<bool> accepted_before(keys.size(), false);
  int homed = 0;
  for (size_t i = 0; i < keys.size(); ++i) homed += ring.Home(keys[i]) == 2;
  for (const double fraction : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    const absl::Time now = t0 + warmup * fraction;
    EXPECT_DOUBLE_EQ(ring.PutFraction(2, now), fraction);
    int accepted = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const int home = ring.Home(keys[i]);
      const int target = ring.PutTarget(keys[i], now);
      if (home != 2) {
        EXPECT_EQ(target, home);  // the warm stores get all of their puts
        continue;
      }
      EXPECT_TRUE(target == 2 || target == -1);  // skipped, never redirected
      if (target == 2) {
        ++accepted;
        accepted_before[i] = true;
      } else {
        EXPECT_FALSE(accepted_before[i]) << "a key accepted earlier in the warm-up was refused later";
      }
    }
    EXPECT_NEAR(accepted, homed * fraction, homed * 0.02) << "at fraction " << fraction;
  }
  EXPECT_EQ(ring.PutFraction(2, t0 + 2 * warmup), 1.0);
}

}  // namespace
}  // namespace kvmesh::kv_store
