// StoreRing: which kv-store is a block's home, by rendezvous (highest-random-weight)
// hashing of its StoreKey over the stores' addresses.
//
// Each (key, store) pair gets a pseudo-random weight, XXH3-64 of the key seeded with a
// hash of the store's address; the key's home is the store of highest weight. Adding a
// store moves to it exactly the keys it now outweighs (about 1/N of them), removing one
// moves only its own keys, each to its runner-up: no other key changes home, and the
// order of the address list does not matter.
//
// A store that comes back empty (a new epoch: a restart) would otherwise receive the
// write-through of every hot block of its share at once (Mooncake #3688). While a store
// warms up, PutTarget() gives it puts gradually: a key homed there is put only when its
// own draw (a second hash of key and store, uniform in [0, 1)) is below the fraction of
// the warm-up period that has passed, so the accepted set grows from none to all, and a
// key once accepted stays accepted. The other puts are skipped, not redirected: reads
// go to the home regardless (Home()), where such a key is a miss either way.
//
// Thread-safety: not thread-safe (a value); the client guards it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kv_store/store_key.h"

namespace kvmesh::kv_store {

class StoreRing {
 public:
  // `addresses` as given to the client ("host:port"); their order does not matter.
  // `warmup`: how long a store with a new epoch takes to be given all of its puts.
  StoreRing(std::vector<std::string> addresses, absl::Duration warmup);

  int num_stores() const { return static_cast<int>(stores_.size()); }
  const std::string& address(int store) const { return stores_[store].address; }
  absl::Duration warmup() const { return warmup_; }

  // The index (into the constructor's list) of `key`'s home; -1 when there is no store.
  int Home(const StoreKey& key) const;

  // The store `key` should be put to at `now`: its home, or -1 while the home warms up
  // and the key's draw is not yet below the warm-up fraction.
  int PutTarget(const StoreKey& key, absl::Time now) const;

  // Store `store` came back empty at `now` (its epoch changed): its puts ramp up again.
  void StartWarmup(int store, absl::Time now);

  // The fraction of its puts `store` is given at `now`: in [0, 1], 1 once warm.
  double PutFraction(int store, absl::Time now) const;

 private:
  struct Store {
    std::string address;
    uint64_t seed = 0;       // XXH3-64 of the address: the store's weight seed
    uint64_t ramp_seed = 0;  // another seed, for the warm-up draw
    absl::Time warmup_started = absl::InfinitePast();
  };

  std::vector<Store> stores_;
  absl::Duration warmup_;
};

}  // namespace kvmesh::kv_store
