// KV transfer for a tensor-parallel group (ARCHITECTURE.md §3 "Transfer", rank to rank):
// a block's KV is tp_size shares, one in each rank's pool under the same block id, and
// rank r of the sender writes only into rank r of the receiver. Each rank has its own
// transport (its own UCX worker, progressed on its own thread) and registered pool, so
// the ranks' puts run side by side; one transfer is then one lease (receiver) or one
// push (sender) per rank, and these types make the group behave as one: a group lease
// reports once (OK when every rank's lease landed, else the first error) and a group
// push finishes once (OK when every rank's receiver acknowledged, else the first error,
// after which the other ranks are cancelled). With tp_size 1 they are the plain lease
// and push.
//
// Thread-safety: thread-safe as KvTransport; callbacks run on a rank transport's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kv/transport/kv_transport.h"

namespace kvmesh::kv {

// One rank's transport and its registered pool (both outlive every group object).
struct KvRankPool {
  KvTransport* transport = nullptr;
  KvPoolHandle pool;
};

// The receiver's leases of one transfer, rank order.
struct KvRankGroupGrant {
  std::vector<uint64_t> lease_tokens;
  std::vector<std::string> descriptors;  // one per rank, handed to the sender's rank r
};

// Opens one lease per rank over `block_ids` (the same ids in every rank's pool).
// on_done runs once: OK with the ranks' stats summed when every lease landed, else the
// first failure (the other leases are closed with it). on_released (may be empty) runs
// once after it, when every rank's lease was released (KvLeaseOptions::on_released):
// the blocks are free in no rank before. On error nothing stays open and neither runs.
absl::StatusOr<KvRankGroupGrant> OpenRankGroupLease(std::span<const KvRankPool> ranks,
                                                    const std::vector<BlockId>& block_ids, KvLeaseDoneFn on_done,
                                                    KvLeaseReleasedFn on_released = nullptr);

// Ends every rank's lease early (KvTransport::CloseLease with `status`).
void CloseRankGroupLease(std::span<const KvRankPool> ranks, const std::vector<uint64_t>& lease_tokens,
                         const absl::Status& status);

// One push per rank, rank r from the local rank r's pool into descriptor r.
class KvRankGroupPush {
 public:
  // InvalidArgument when the descriptor count differs from the local ranks (the peers'
  // tensor-parallel sizes differ); otherwise the first rank's OpenPush error (pushes
  // already opened are cancelled).
  static absl::StatusOr<std::unique_ptr<KvRankGroupPush>> Open(std::span<const KvRankPool> ranks,
                                                               std::span<const std::string> descriptors);
  ~KvRankGroupPush();

  int32_t tp_size() const { return static_cast<int32_t>(pushes_.size()); }
  // KvPush::PutLayer on rank `rank`'s push; InvalidArgument for a rank out of range.
  absl::Status PutLayer(int32_t rank, int32_t layer, int32_t first_index, std::span<const BlockId> src_blocks);
  // Finishes every rank; on_done once: OK with the stats summed (seconds: the slowest
  // rank's) when every rank's receiver acknowledged, else the first error (the other
  // ranks are then cancelled).
  void Finish(KvPushDoneFn on_done);
  // Cancels every rank's push.
  void Cancel();

 private:
  explicit KvRankGroupPush(std::vector<std::unique_ptr<KvPush>> pushes);
  std::vector<std::unique_ptr<KvPush>> pushes_;
};

}  // namespace kvmesh::kv
