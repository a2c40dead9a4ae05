// KvHandoffLedger: the one owner of every KV block's hand-off state between two
// engines (prefill/decode disaggregation), beside the pool's own used/cached/free
// states (kv/block_pool.h) and the lower tiers' (kv/kv_tiers.h).
//
// Two kinds of entries, each a small state machine that ends exactly once:
//
//   decode side — a lease on the blocks a remote prefill fills:
//       Grant ──▶ open ──(RecordImport)*──▶ Close(kCommitted | kFailed | kAborted | kExpired)
//                                                 │ (not committed, direct writes pending)
//                                                 ▼
//                                            quarantined ──WritersGone──▶ released
//     An open lease past its deadline is refused by Find at once and reported by
//     Expired() until its owner closes it.
//     Quarantine: a lease whose blocks a transport writes directly (ExpectDirectWrites:
//     cross-memory attach, which the receiver cannot refuse) may have a writer that
//     outlives it — stopped mid-write, it lands its write whenever it resumes. Such a
//     lease that ends uncommitted before its transport said the writers are gone
//     (WritersGone) keeps its transferred blocks quarantined: Close returns them and
//     the owner holds them out of the pool (KvCacheManager::HoldBlocks) until
//     WritersGone returns them again. The request itself ends (or is prefilled again,
//     in other blocks) at once. A quarantine lasts as long as its writer lives silent
//     (kv/transport/ucx/writer_fence.h): it is no leak while bounded by the writer's
//     word or death (a live writer is refused at its next message and answers within
//     its keepalive), and counts as stranded past the deadline its Close gave it.
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
  // A transport writes the blocks directly, and its writers may outlive the lease
  // (ExpectDirectWrites), until it says they are gone (WritersGone).
  bool direct_writes_pending = false;

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
  int64_t leases_quarantined = 0;  // of the failed, expired and aborted: their blocks quarantined
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
  // Ends the lease (no-op for an unknown id). Returns the blocks it quarantined (see the
  // header comment), stranded from `quarantine_deadline_ms` on: the caller keeps them
  // out of the pool until WritersGone returns them; empty for a commit, a lease without
  // pending direct writes, or an unknown id.
  std::vector<BlockId> Close(KvTransferId id, LeaseEnd end, int64_t quarantine_deadline_ms);
  // A transport writes the open lease's blocks directly: an end other than a commit
  // quarantines them until WritersGone. No-op for an unknown id.
  void ExpectDirectWrites(KvTransferId id);
  // The transport says the lease's direct writers can write no more. An open lease's end
  // then quarantines nothing; a quarantined lease is released: its blocks are returned
  // (the caller drops its hold). Empty otherwise (unknown, committed, released).
  std::vector<BlockId> WritersGone(KvTransferId id);
  // Blocks quarantined now, and how many leases hold them.
  int64_t num_quarantined_blocks() const { return num_quarantined_blocks_; }
  int32_t num_quarantined_leases() const { return static_cast<int32_t>(quarantined_.size()); }
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

  // Blocks of leases, pins and quarantines past their deadline at `now_ms`: what nobody
  // has ended in time (part of kvmesh_kv_blocks_stranded).
  int64_t StrandedBlocks(int64_t now_ms) const;
  const KvHandoffStats& stats() const { return stats_; }
  // No open lease or pin (quarantines aside: they have no deadline to reclaim).
  bool empty() const { return leases_.empty() && pins_.empty(); }

 private:
  struct Quarantine {
    std::vector<BlockId> block_ids;
    int64_t deadline_ms = 0;
  };
  absl::flat_hash_map<KvTransferId, KvLease> leases_;
  absl::flat_hash_map<KvTransferId, Quarantine> quarantined_;
  int64_t num_quarantined_blocks_ = 0;
  absl::flat_hash_map<std::string, KvTransferId> lease_of_request_;
  absl::flat_hash_map<std::string, KvExportPin> pins_;
  int64_t next_transfer_id_ = 1;
  KvHandoffStats stats_;
};

}  // namespace kvmesh::kv
