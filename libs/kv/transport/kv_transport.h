// KvTransport: the data plane of a prefill -> decode KV hand-off (ARCHITECTURE.md §3
// "Transfer"), below protobuf: it moves whole blocks of registered pools and nothing
// else. The control plane (the workers' gRPC calls) carries the one thing it produces
// for the peer, a lease descriptor, as opaque bytes.
//
// One transfer:
//   receiver (decode)                                   sender (prefill)
//   pool = RegisterPool(storage)            (once)      pool = RegisterPool(storage) (once)
//   desc = OpenLease(pool, {block ids}, on_done)
//                          ── desc (gRPC, with the Prefill call) ──▶
//                                                       push = OpenPush(pool, desc)
//                                                         (refused: malformed, unknown
//                                                          lease, KV spec mismatch)
//                                                       push->PutLayer(layer, i, src ids)
//                                                         ... as each layer is computed
//                                                       push->Finish(on_done)
//                                                         (flush, then the completion)
//   on_done(OK): every (layer, block) landed                on_done(OK): the receiver
//     → commit the lease                                      acknowledged it
//
// The lease, not the transport, owns the destination blocks: the transport writes into
// them and reports; the receiver's caller commits or fails the engine's lease, and the
// sender's caller unpins its source blocks after its on_done (the puts read them until
// then). A lease ends in exactly one on_done: OK, or an error (the sender died or went
// quiet past the progress deadline, sent a bad completion, or CloseLease).
//
// Its blocks are free again only at its on_released (KvLeaseOptions), which runs once,
// after on_done, when no sender can write into them any more: with on_done for a lease
// that landed or never had a sender; later for one that failed while a sender writing
// straight into the pool (a same-host write the receiver cannot refuse) might still
// run — when that sender says it stopped or its process is gone, never while it lives
// silent (a stopped process keeps them: ucx/writer_fence.h). Until then the caller
// keeps them out of use (quarantined), whatever became of its request.
//
// Thread-safety: implementations are thread-safe; callbacks run on the transport's own
// thread and must be quick (post elsewhere) and must not call back into the transport
// synchronously except for CloseLease / Cancel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_layout.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

// A registered pool of this process (an index into the transport's table).
struct KvPoolHandle {
  int32_t value = -1;
  auto operator<=>(const KvPoolHandle&) const = default;
};

// What one transfer did, for the metrics.
struct KvTransferStats {
  int64_t bytes = 0;             // payload bytes put
  int64_t descriptors = 0;       // puts posted (one per layer and merged run)
  // Merged runs per layer as put: the most of any layer, summed over its PutLayer calls
  // (a run a call boundary splits counts twice). descriptors <= layers x runs.
  int64_t runs = 0;
  int64_t blocks = 0;            // (layer, block) pairs put
  double seconds = 0;            // OpenPush to the completion's acknowledgement
};

using KvLeaseReleasedFn = std::function<void()>;

// The receiver's side of one lease.
struct KvLeaseOptions {
  // Destination block ids in the receiver's pool, in the order the sender indexes them.
  // Distinct, in range of the pool.
  std::vector<BlockId> block_ids;
  // Runs once, after on_done, when nothing can write into the blocks any more (see the
  // header comment); may be empty. Not run when the transport is destroyed first.
  KvLeaseReleasedFn on_released;
};

// What OpenLease grants: the token that names the lease here and the descriptor to hand
// the sender.
struct KvLeaseGrant {
  uint64_t lease_token = 0;
  std::string descriptor;
};

using KvLeaseDoneFn = std::function<void(const absl::Status& status, const KvTransferStats& stats)>;
using KvPushDoneFn = std::function<void(const absl::Status& status, const KvTransferStats& stats)>;

// One transfer into one remote lease, from the sender's registered pool.
//
// Thread-safety: thread-safe. PutLayer checks and queues (the puts are posted on the
// transport's thread), or copies at memory speed where the receiver is on this host
// (UcxKvTransportOptions::cross_memory_attach).
class KvPush {
 public:
  virtual ~KvPush() = default;

  // Puts blocks [first_index, first_index + src_blocks.size()) of the lease, layer
  // `layer`, from the local pool's blocks `src_blocks`, merging adjacent blocks into one
  // put. Refused, with nothing queued: InvalidArgument for a layer or index outside the
  // lease, a local block outside the pool, or a (layer, block) already put;
  // FailedPrecondition after Finish or Cancel; the push's error once it failed.
  virtual absl::Status PutLayer(int32_t layer, int32_t first_index, std::span<const BlockId> src_blocks) = 0;
  // No more puts: waits until every put completed remotely (flush), sends the
  // completion, and calls on_done once with the receiver's answer (OK when it counted
  // every (layer, block) of the lease) or the push's error. Later calls are ignored.
  virtual void Finish(KvPushDoneFn on_done) = 0;
  // Abandons the transfer: queued puts are dropped, the receiver's lease fails, and
  // on_done (if Finish was called) gets Cancelled after in-flight puts completed.
  virtual void Cancel() = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // "ucx", "grpc", ...
  virtual std::string_view name() const = 0;

  // Registers a pool's whole buffer once: [base, base + layout.TotalBytes()) in `layout`.
  // The memory must outlive the transport. InvalidArgument for a null or empty pool;
  // Internal when the transport cannot register it.
  virtual absl::StatusOr<KvPoolHandle> RegisterPool(std::byte* base, const KvLayout& layout) = 0;

  // Receiver: lets one sender write `options.block_ids` of `pool` (every layer) and
  // returns the lease descriptor to hand it. on_done runs once, then
  // options.on_released (see the header comment). InvalidArgument for an unknown pool
  // or bad block ids.
  virtual absl::StatusOr<KvLeaseGrant> OpenLease(KvPoolHandle pool, KvLeaseOptions options,
                                                 KvLeaseDoneFn on_done) = 0;
  // Receiver: ends a lease early (on_done gets `status` unless it already ran); the
  // sender's later messages are refused. Unknown tokens are ignored.
  // An Unavailable `status` says the sender is gone: nothing is sent to it.
  virtual void CloseLease(uint64_t lease_token, absl::Status status) = 0;

  // Sender: opens a push from local `pool` into the lease of `descriptor`. Blocks until
  // the receiver accepted it (or timed out). InvalidArgument for a malformed descriptor
  // (framing, checksum, rkey, worker address) or a KV layout that differs from the local
  // pool's; NotFound when the receiver does not know the lease (never granted, expired
  // or closed); Unavailable when the receiver cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<KvPush>> OpenPush(KvPoolHandle pool, std::string_view descriptor) = 0;
};

}  // namespace kvmesh::kv
