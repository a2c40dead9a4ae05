// KvStoreClient: one client over several kv-stores (kvmesh.v1.KvStore) that share one
// key space. A block's home is chosen by rendezvous hashing of its StoreKey
// (store_ring.h); every call fans out to the homes of its keys in parallel and is
// bounded by the caller's deadline.
//
// The life of a load and a save:
//   1. Lookup(keys, deadline): each home reports the leading run of its keys it holds and
//      leases them; the result is the chain's leading run present across all homes.
//   2. Get(lookup, out, deadline): streams the blocks into `out`, verifying each one
//      against its checksum (kv::Checksum) before copying it; releases the leases of the
//      stores it read from. Its result is the leading run of blocks loaded AND verified;
//      the rest are misses, to be recomputed.
//   3. Release(lookup, deadline): drops the leases Get did not (a lookup not followed by
//      a Get). A lease left alone ends by itself after the store's --lease_ms.
//   4. Put(keys, blocks, deadline): PutIntent, then one Put stream per home; blocks a
//      home already holds, and blocks this client knows it holds, are not sent.
//
// With a data plane (options.data_plane: a kv::KvTransport and the registered pool the
// caller's blocks live in, store_data_plane.h) the bytes of blocks that lie exactly in
// that pool move one-sided over UCX to and from stores that run one
// (kv_store_server/kv_store_data_plane.h): Put pushes into the lease PutIntent grants
// and commits in place; Get leases the destination blocks, the store pushes into them,
// and every landed block is verified against its committed checksum before it counts
// as loaded. A store without the data plane, blocks outside the pool, or a UCX
// transfer that fails: Get fetches those blocks over the gRPC stream instead (once the
// lease is released: nothing can still write into them), Put leaves them not stored.
//
// A store is a cache, never a dependency: a store that is dead, hung (the deadline
// passes), partitioned or restarted costs a miss — Lookup, Get and Put never fail for
// it and never wait past their deadline. Their results carry the first store error for
// logs; the counters in stats() count them. A block whose bytes fail their checksum is
// a miss too (DataLoss, counted), never handed to the caller as loaded.
//
// Epochs: every response carries its store's epoch (a random value chosen at start).
// The client remembers the last epoch of each store and which blocks it believes each
// store holds; when a store's epoch changes (it restarted, empty), the client forgets
// everything it believed of it, and starts that store's put warm-up (StoreRing). Lease
// ids and intent tokens are sent with their epoch, so a restarted store refuses them.
//
// Thread-safety: thread-safe; calls may run concurrently from any threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "kv_store/store_data_plane.h"
#include "kv_store/store_key.h"
#include "kv_store/store_ring.h"
#include "rpc/channel.h"

namespace kvmesh::kv_store {

struct KvStoreClientOptions {
  std::vector<std::string> addresses;  // host:port of every store; at least one
  // Sent as "authorization: Bearer <api_key>" when not empty (the stores' --api_keys).
  std::string api_key;
  // How long a store with a new epoch takes to be given all of its puts (StoreRing).
  int64_t warmup_ms = 30'000;
  // Blocks the client remembers per store as held there (Put skips them); past this the
  // memory of that store starts over. 0: remember none.
  int64_t max_known_blocks_per_store = 1 << 20;
  Clock* clock = nullptr;  // the warm-up's clock; nullptr: Clock::Real(); must outlive this
  rpc::ChannelOptions channel;
  KvStoreDataPlane data_plane;  // disabled by default: the gRPC stream only
};

// The result of a Lookup, consumed by Get and Release.
struct KvStoreLookup {
  struct StoreLease {
    int store = -1;
    uint64_t epoch = 0;
    uint64_t lease_id = 0;
    bool released = false;
  };
  int32_t num_present = 0;       // keys[0, num_present) are held by their homes
  std::vector<StoreKey> keys;    // those keys
  std::vector<int> homes;        // the store of each
  std::vector<StoreLease> leases;
  absl::Status error;            // the first store error (for logs); the keys past it miss
};

struct KvStoreGetResult {
  int32_t num_loaded = 0;  // out[0, num_loaded) hold verified blocks; the rest are misses
  absl::Status error;      // why block num_loaded was not loaded (OK when all were)
};

struct KvStorePutResult {
  int32_t num_committed = 0;      // written now
  int32_t num_present = 0;        // held already (the home said so, or this client knew)
  int32_t num_skipped = 0;        // not put: the home is warming up (StoreRing)
  int32_t num_not_stored = 0;     // refused: another writer, no space, or a failed call
  absl::Status error;             // the first store error (for logs)
};

struct KvStoreClientStats {
  int64_t lookups = 0;
  int64_t lookup_hit_blocks = 0;
  int64_t get_blocks = 0;            // loaded and verified
  int64_t get_bytes = 0;
  int64_t checksum_failures = 0;     // blocks received whose bytes did not match
  int64_t put_blocks = 0;            // committed
  int64_t put_bytes = 0;
  int64_t store_errors = 0;          // failed calls (unavailable, deadline, refused)
  int64_t epoch_changes = 0;         // restarts seen
  int64_t ucx_get_blocks = 0;        // loaded and verified over the data plane
  int64_t ucx_put_blocks = 0;        // committed over the data plane
  int64_t ucx_fallbacks = 0;         // gets whose data plane transfer failed: then the stream
};

class KvStoreClient {
 public:
  // Channels are created here (rpc::CreateChannel: mutual TLS when configured) and
  // connect lazily. InvalidArgument without addresses or with one twice.
  static absl::StatusOr<std::unique_ptr<KvStoreClient>> Create(KvStoreClientOptions options);
  ~KvStoreClient();
  KvStoreClient(const KvStoreClient&) = delete;
  KvStoreClient& operator=(const KvStoreClient&) = delete;

  int num_stores() const { return static_cast<int>(stores_.size()); }

  // Step 1. `keys` in chain order (at most kMaxKeysPerRequest, kv_store_wire.h, else
  // all miss).
  KvStoreLookup Lookup(std::span<const StoreKey> keys, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Step 2. Loads lookup.keys[i] into out[i] for i < out.size(). Each out[i] must be the
  // block's size exactly (a block of another size is a miss, DataLoss). out.size() >
  // lookup.num_present is InvalidArgument in the result, nothing loaded.
  KvStoreGetResult Get(KvStoreLookup& lookup, std::span<const std::span<std::byte>> out, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Step 3. Drops the leases still held by `lookup` (best effort, bounded by `deadline`).
  void Release(KvStoreLookup& lookup, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Step 4. Puts blocks[i] as keys[i]. Every block must have the same size; `checksums`
  // is empty (computed here) or holds kv::Checksum of each block. InvalidArgument in
  // the result, nothing sent, when the sizes or counts disagree.
  KvStorePutResult Put(std::span<const StoreKey> keys, std::span<const std::span<const std::byte>> blocks,
                       std::span<const uint64_t> checksums, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  KvStoreClientStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last epoch seen from store `store` (an index into options.addresses); 0: none yet.
  uint64_t epoch(int store) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Store;
  struct StoreBelief {
    uint64_t epoch = 0;                      // 0: not heard from yet
    absl::flat_hash_set<StoreKey> held;      // blocks believed held in this epoch
  };

  explicit KvStoreClient(KvStoreClientOptions options);

  // Takes `epoch` as store `store`'s current one; a change forgets what was believed
  // of it and starts its warm-up. False when the epoch changed.
  bool ObserveEpochLocked(int store, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberHeldLocked(int store, const StoreKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvStoreClientOptions options_;
  Clock& clock_;
  std::vector<std::unique_ptr<Store>> stores_;  // channels and stubs: thread-safe

  mutable absl::Mutex mu_;
  StoreRing ring_ ABSL_GUARDED_BY(mu_);
  std::vector<StoreBelief> beliefs_ ABSL_GUARDED_BY(mu_);
  KvStoreClientStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmesh::kv_store
