// KvHandoffLedger: the one owner of every KV block's hand-off state between two
// engines (prefill/decode disaggregation), beside the pool's own used/cached/free
// states (kv/block_pool.h) and the lower tiers' (kv/kv_tiers.h).
//
// Two kinds of entries, each a small state machine that ends exactly once:
//
//   decode side — a lease on the blocks a remote prefill fills:
//       Grant ──▶ open ──(RecordImport)*──▶ Close(kCommitted | kFailed | kAborted | kExpired)
//     An open lease past its deadline is refused by Find at once and reported by
//     Expired() until its owner closes it.
//   prefill side — blocks pinned for export until the decode side has them:
//       Pin ──▶ pinned ──▶ Unpin (released, ended, expired)
//
// The ledger keeps ids and deadlines; the blocks' references stay with the
// KvCacheManager's tables (a leased or pinned block is a table's block), so freeing is
// the scheduler's job when it ends the request, and StrandedBlocks() says what nobody
// is ending in time.
//
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

// Names one lease of the decode engine that granted it (unique per ledger, never reused).
struct KvTransferId {
  int64_t value = -1;

  auto operator<=>(const KvTransferId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const KvTransferId& id) {
    return H::combine(std::move(h), id.value);
  }
};

struct KvLease {
  std::string request_id;
  std::vector<BlockId> block_ids;  // the whole prompt, in position order
  int32_t num_cached_blocks = 0;   // leading blocks served locally: never imported
  int32_t num_layers = 0;
  int64_t deadline_ms = 0;
  std::vector<bool> imported;  // [layer * block_ids.size() + block index]
  int64_t num_imported = 0;    // distinct (layer, block) pairs imported

  // (layer, block) pairs a complete transfer imports.
  int64_t num_expected() const {
    return static_cast<int64_t>(num_layers) * (static_cast<int64_t>(block_ids.size()) - num_cached_blocks);
  }
};

struct KvExportPin {
  std::vector<BlockId> block_ids;
  int64_t deadline_ms = 0;
};

struct KvHandoffStats {
  // granted = committed + failed + expired + aborted + open.
  int64_t leases_granted = 0;
  int64_t leases_committed = 0;
  int64_t leases_failed = 0;
  int64_t leases_expired = 0;
  int64_t leases_aborted = 0;
  int64_t pins_expired = 0;  // export pins whose release timed out
};

class KvHandoffLedger {
 public:
  enum class LeaseEnd : uint8_t { kCommitted, kFailed, kAborted, kExpired };

  // ---- Decode side ----
  KvTransferId Grant(std::string request_id, std::vector<BlockId> block_ids, int32_t num_cached_blocks,
                     int32_t num_layers, int64_t deadline_ms);
  // The open lease, not past its deadline at `now_ms`. FailedPrecondition (naming
  // `caller`) for an unknown, closed or expired lease.
  absl::StatusOr<KvLease*> Find(KvTransferId id, int64_t now_ms, const char* caller);
  // Validates that (layer, block_index) may be written into the lease and returns the
  // destination block: InvalidArgument for a layer or index out of range or a locally
  // cached block. Call RecordImport once the bytes are in.
  absl::StatusOr<BlockId> ImportTarget(const KvLease& lease, int32_t layer, int32_t block_index) const;
  void RecordImport(KvLease& lease, int32_t layer, int32_t block_index);
  // Ends the lease (no-op for an unknown id).
  void Close(KvTransferId id, LeaseEnd end);
  // The open lease of a request, if any.
  const KvTransferId* LeaseOf(const std::string& request_id) const;
  // Open leases past their deadline, in id order.
  std::vector<KvTransferId> ExpiredLeases(int64_t now_ms) const;
  const KvLease* lease(KvTransferId id) const;
  int32_t num_open_leases() const { return static_cast<int32_t>(leases_.size()); }

  // ---- Prefill side ----
  void Pin(const std::string& request_id, std::vector<BlockId> block_ids, int64_t deadline_ms);
  const KvExportPin* pin(const std::string& request_id) const;
  // Drops a pin (released or ended); `expired` counts it in stats().pins_expired.
  void Unpin(const std::string& request_id, bool expired = false);
  // Pinned requests past their deadline, sorted.
  std::vector<std::string> ExpiredPins(int64_t now_ms) const;
  int32_t num_pins() const { return static_cast<int32_t>(pins_.size()); }

  // Blocks of leases and pins past their deadline at `now_ms`: what nobody has ended in
  // time (part of kvmesh_kv_blocks_stranded).
  int64_t StrandedBlocks(int64_t now_ms) const;
  const KvHandoffStats& stats() const { return stats_; }
  bool empty() const { return leases_.empty() && pins_.empty(); }

 private:
  absl::flat_hash_map<KvTransferId, KvLease> leases_;
  absl::flat_hash_map<std::string, KvTransferId> lease_of_request_;
  absl::flat_hash_map<std::string, KvExportPin> pins_;
  int64_t next_transfer_id_ = 1;
  KvHandoffStats stats_;
};

}  // namespace kvmesh::kv
