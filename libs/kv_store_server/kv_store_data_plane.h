// KvStoreUcxPlane: the kv-store's UCX data plane (kvmesh.v1.KvStore, "The UCX data
// plane"): block bytes move one-sided between the store's slot memory and a worker's
// registered host blocks through kv::UcxKvTransport (libs/kv/transport/ucx), the P/D
// hand-off's transport, instead of inside gRPC messages. The control plane — and with
// it who may write or read what — stays the authenticated gRPC service.
//
// Direction. The transport has one shape: a receiver leases blocks of its registered
// pool and hands the descriptor to a sender, who pushes runs into them (rendezvous
// active messages received straight into the pool, or cross-memory attach on one
// host) and finishes with a completion the receiver checks. So the side the bytes go
// TO always leases:
//   put  (store receives)  PutIntent(ucx_lease) → the reserved slots are lent
//        (BlockStore::LendIntents) and leased; the descriptor goes back in the
//        response; the worker pushes its blocks and Finishes, then sends Put messages
//        with in_place = true and each block's checksum; on_released returns the slots
//        (landed or failed) and BlockStore::CommitInPlace verifies each block's bytes
//        against its checksum before it becomes visible.
//   get  (store sends)     the worker leases its destination blocks and puts the
//        descriptor in the Get request; the store holds the blocks (BeginRead), pushes
//        them, and streams in_place messages with their committed checksums; the
//        worker verifies every landed block before it counts as loaded (a failure is a
//        miss: fetched over the gRPC stream or recomputed, never served).
// The transport's own per-run checksums are off here: the store's per-block checksum
// is end to end (written by the worker, checked by the store on put, by the worker on
// get) and checking both would read every byte twice more.
//
// Authentication: descriptors (which carry the UCX memory keys) are granted only in the
// answer to an authenticated PutIntent, and the store pushes only into descriptors that
// came in an authenticated Get; a lease accepts only a sender that names its random
// token. Every descriptor from the wire is decoded and checked (framing, checksum,
// layout, one block per key, size bound) before use, and its same-host pid is dropped
// unless options.cma_into_readers: the store never writes into a process the wire names.
//
// Thread-safety: thread-safe. Gets are pushed on this plane's own threads (OpenPush
// waits for the receiver's answer; gRPC's threads never do); the transport's callbacks
// run on its thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kv/transport/ucx/ucx_kv_transport.h"
#include "kv_store/block_store.h"
#include "kv_store/store_key.h"

namespace kvmesh::kv_store {

struct KvStoreUcxOptions {
  std::string tls;  // UCX_TLS for the store's context; empty: UCX's choice
  // A put lease whose writer did not open its push within this long ends and its slots
  // are freed (the intent timeout is the natural value).
  int64_t hello_timeout_ms = 10'000;
  // How long an in-place Put message waits for its lease's slots to be returned.
  int64_t commit_wait_ms = 2'000;
  bool cross_memory_attach = true;
  // Get pushes on this host write straight into the reader's process by cross-memory
  // attach (process_vm_writev into the pid its descriptor names) instead of letting the
  // reader pull the blocks through UCX's rendezvous. NOTE: off by default: that pid
  // comes from the wire, and nothing proves it is the authenticated caller's, so a
  // forged descriptor could aim the store's writes at another process of its user.
  // Turn on only where every client is trusted. (Puts are unaffected: there the store
  // is written, into its own pool, by the pid it named itself.)
  bool cma_into_readers = false;
  // Threads that push gets (a same-host push copies on its thread, by cross-memory
  // attach): concurrent gets, or pieces of one, copy in parallel.
  int32_t push_threads = 2;
};

class KvStoreUcxPlane {
 public:
  // The blocks of one get that were pushed: their committed checksums, in key order (a
  // leading run of the keys); `status` says why the rest were not.
  using GetDoneFn = std::function<void(absl::Status status, std::vector<uint64_t> checksums)>;

  // Internal when UCX cannot start or register the store's memory.
  static absl::StatusOr<std::unique_ptr<KvStoreUcxPlane>> Create(BlockStore& store, const KvStoreUcxOptions& options);
  ~KvStoreUcxPlane();  // ends the pending gets (Cancelled) and every lease
  KvStoreUcxPlane(const KvStoreUcxPlane&) = delete;
  KvStoreUcxPlane& operator=(const KvStoreUcxPlane&) = delete;

  // The block size the plane carries: the store's slot stride.
  int64_t block_bytes() const { return store_.stride_bytes(); }
  absl::Duration commit_wait() const { return absl::Milliseconds(options_.commit_wait_ms); }

  // Put: lends the slots of the reserved intents (keys[i], tokens[i]) and returns the
  // descriptor of a lease over them, in that order. FailedPrecondition as LendIntents;
  // Internal when the transport refuses the lease (the intents stay plain intents).
  absl::StatusOr<std::string> OpenPutLease(std::span<const StoreKey> keys, std::span<const uint64_t> tokens);

  // Get: queues a push of the committed blocks of `keys` (a leading run: it stops at
  // the first that is not committed, NotFound) into the lease of `descriptor`; `done`
  // runs once, on another thread. InvalidArgument for a descriptor that does not
  // decode, does not have one block per key or is not of this plane's layout;
  // Unavailable / NotFound from the transport (receiver gone, lease unknown).
  void PushGet(std::vector<StoreKey> keys, std::string descriptor, GetDoneFn done);

  const kv::UcxKvTransport& transport() const { return *transport_; }

 private:
  struct GetJob {
    std::vector<StoreKey> keys;
    std::string descriptor;
    GetDoneFn done;
  };

  KvStoreUcxPlane(BlockStore& store, const KvStoreUcxOptions& options, std::unique_ptr<kv::UcxKvTransport> transport,
                  kv::KvPoolHandle pool);
  void PushLoop();
  void RunGet(GetJob job);

  BlockStore& store_;
  const KvStoreUcxOptions options_;
  const std::unique_ptr<kv::UcxKvTransport> transport_;
  const kv::KvPoolHandle pool_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<GetJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> push_threads_;
};

}  // namespace kvmesh::kv_store
