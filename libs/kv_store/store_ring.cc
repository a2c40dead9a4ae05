#include "kv_store/store_ring.h"

#include <algorithm>
#include <utility>

#include <xxhash.h>

namespace kvmesh::kv_store {
namespace {

// Seeds the weights of a store from its address; the ramp seed differs by a constant, so
// a key's warm-up draw is independent of its weight.
constexpr uint64_t kRampSalt = 0x9e3779b97f4a7c15ULL;

uint64_t Weight(const StoreKey& key, uint64_t seed) {
  const uint64_t words[2] = {key.low, key.high};
  return XXH3_64bits_withSeed(words, sizeof(words), seed);
}

}  // namespace

StoreRing::StoreRing(std::vector<std::string> addresses, absl::Duration warmup) : warmup_(warmup) {
  stores_.reserve(addresses.size());
  for (std::string& address : addresses) {
    const uint64_t seed = XXH3_64bits(address.data(), address.size());
    stores_.push_back(Store{.address = std::move(address), .seed = seed, .ramp_seed = seed ^ kRampSalt});
  }
}

int StoreRing::Home(const StoreKey& key) const {
  int best = -1;
  uint64_t best_weight = 0;
  for (int i = 0; i < num_stores(); ++i) {
    const uint64_t w = Weight(key, stores_[i].seed);
    // Ties (equal 64-bit weights) go to the smaller address, so the choice never depends
    // on the order of the list.
    if (best < 0 || w > best_weight || (w == best_weight && stores_[i].address < stores_[best].address)) {
      best = i;
      best_weight = w;
    }
  }
  return best;
}

double StoreRing::PutFraction(int store, absl::Time now) const {
  const absl::Duration elapsed = now - stores_[store].warmup_started;
  if (warmup_ <= absl::ZeroDuration() || elapsed >= warmup_) return 1.0;
  return std::max(0.0, absl::FDivDuration(elapsed, warmup_));
}

int StoreRing::PutTarget(const StoreKey& key, absl::Time now) const {
  const int home = Home(key);
  if (home < 0) return -1;
  const double fraction = PutFraction(home, now);
  if (fraction >= 1.0) return home;
  // The top 53 bits of the draw as a double in [0, 1).
  const double draw = static_cast<double>(Weight(key, stores_[home].ramp_seed) >> 11) * 0x1.0p-53;
  return draw < fraction ? home : -1;
}

void StoreRing::StartWarmup(int store, absl::Time now) { stores_[store].warmup_started = now; }

}  // namespace kvmesh::kv_store
