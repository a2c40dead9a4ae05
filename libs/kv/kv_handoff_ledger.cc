#include "kv/kv_handoff_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv {

KvTransferId KvHandoffLedger::Grant(std::string request_id, std::vector<BlockId> block_ids, int32_t num_cached_blocks,
                                    int32_t num_layers, int64_t deadline_ms) {
  const KvTransferId id{next_transfer_id_++};
  ++stats_.leases_granted;
  KvLease lease{.request_id = request_id,
                .block_ids = std::move(block_ids),
                .num_cached_blocks = num_cached_blocks,
                .num_layers = num_layers,
                .deadline_ms = deadline_ms,
                .imported = {},
                .num_imported = 0};
  lease.imported.assign(static_cast<size_t>(num_layers) * lease.block_ids.size(), false);
  leases_.emplace(id, std::move(lease));
  lease_of_request_[std::move(request_id)] = id;
  return id;
}

absl::StatusOr<KvLease*> KvHandoffLedger::Find(KvTransferId id, int64_t now_ms, const char* caller) {
  const auto it = leases_.find(id);
  if (it == leases_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(caller, ": no open KV transfer lease ", id.value,
                                                      " (unknown, committed, failed, aborted or expired)"));
  }
  if (now_ms >= it->second.deadline_ms) {
    return absl::FailedPreconditionError(absl::StrCat(caller, ": KV transfer lease ", id.value, " of request '",
                                                      it->second.request_id, "' has expired"));
  }
  return &it->second;
}

absl::StatusOr<BlockId> KvHandoffLedger::ImportTarget(const KvLease& lease, int32_t layer, int32_t block_index) const {
  const int32_t num_blocks = static_cast<int32_t>(lease.block_ids.size());
  if (layer < 0 || layer >= lease.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImportKvBlock: layer ", layer, " is outside [0, ", lease.num_layers, ")"));
  }
  if (block_index < 0 || block_index >= num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("ImportKvBlock: block ", block_index, " is outside the lease's ",
                                                   num_blocks, " blocks"));
  }
  if (block_index < lease.num_cached_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("ImportKvBlock: block ", block_index,
                                                   " comes from the local prefix cache (the first ",
                                                   lease.num_cached_blocks, "); it is not to be sent"));
  }
  return lease.block_ids[static_cast<size_t>(block_index)];
}

void KvHandoffLedger::RecordImport(KvLease& lease, int32_t layer, int32_t block_index) {
  const size_t bit =
      static_cast<size_t>(layer) * lease.block_ids.size() + static_cast<size_t>(block_index);
  if (!lease.imported[bit]) {
    lease.imported[bit] = true;
    ++lease.num_imported;
  }
}

std::vector<BlockId> KvHandoffLedger::Close(KvTransferId id, LeaseEnd end, int64_t quarantine_deadline_ms) {
  const auto it = leases_.find(id);
  if (it == leases_.end()) return {};
  std::vector<BlockId> quarantined;
  if (end != LeaseEnd::kCommitted && it->second.direct_writes_pending) {
    const KvLease& lease = it->second;
    quarantined.assign(lease.block_ids.begin() + lease.num_cached_blocks, lease.block_ids.end());
    num_quarantined_blocks_ += static_cast<int64_t>(quarantined.size());
    quarantined_[id] = Quarantine{.block_ids = quarantined, .deadline_ms = quarantine_deadline_ms};
    ++stats_.leases_quarantined;
  }
  lease_of_request_.erase(it->second.request_id);
  leases_.erase(it);
  switch (end) {
    case LeaseEnd::kCommitted:
      ++stats_.leases_committed;
      break;
    case LeaseEnd::kFailed:
      ++stats_.leases_failed;
      break;
    case LeaseEnd::kAborted:
      ++stats_.leases_aborted;
      break;
    case LeaseEnd::kExpired:
      ++stats_.leases_expired;
      break;
  }
  return quarantined;
}

void KvHandoffLedger::ExpectDirectWrites(KvTransferId id) {
  if (const auto it = leases_.find(id); it != leases_.end()) it->second.direct_writes_pending = true;
}

std::vector<BlockId> KvHandoffLedger::WritersGone(KvTransferId id) {
  if (const auto it = leases_.find(id); it != leases_.end()) {
    it->second.direct_writes_pending = false;
    return {};
  }
  const auto it = quarantined_.find(id);
  if (it == quarantined_.end()) return {};
  std::vector<BlockId> released = std::move(it->second.block_ids);
  quarantined_.erase(it);
  num_quarantined_blocks_ -= static_cast<int64_t>(released.size());
  return released;
}

const KvTransferId* KvHandoffLedger::LeaseOf(const std::string& request_id) const {
  const auto it = lease_of_request_.find(request_id);
  return it == lease_of_request_.end() ? nullptr : &it->second;
}

std::vector<KvTransferId> KvHandoffLedger::ExpiredLeases(int64_t now_ms) const {
  std::vector<KvTransferId> expired;
  for (const auto& [id, lease] : leases_) {
    if (now_ms >= lease.deadline_ms) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());
  return expired;
}

const KvLease* KvHandoffLedger::lease(KvTransferId id) const {
  const auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

void KvHandoffLedger::Pin(const std::string& request_id, std::vector<BlockId> block_ids, int64_t deadline_ms) {
  pins_[request_id] = KvExportPin{.block_ids = std::move(block_ids), .deadline_ms = deadline_ms};
}

const KvExportPin* KvHandoffLedger::pin(const std::string& request_id) const {
  const auto it = pins_.find(request_id);
  return it == pins_.end() ? nullptr : &it->second;
}

void KvHandoffLedger::Unpin(const std::string& request_id, bool expired) {
  if (pins_.erase(request_id) > 0 && expired) ++stats_.pins_expired;
}

std::vector<std::string> KvHandoffLedger::ExpiredPins(int64_t now_ms) const {
  std::vector<std::string> expired;
  for (const auto& [id, pin] : pins_) {
    if (now_ms >= pin.deadline_ms) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());
  return expired;
}

int64_t KvHandoffLedger::StrandedBlocks(int64_t now_ms) const {
  int64_t stranded = 0;
  for (const auto& [id, lease] : leases_) {
    if (now_ms >= lease.deadline_ms) stranded += static_cast<int64_t>(lease.block_ids.size());
  }
  for (const auto& [id, pin] : pins_) {
    if (now_ms >= pin.deadline_ms) stranded += static_cast<int64_t>(pin.block_ids.size());
  }
  for (const auto& [id, q] : quarantined_) {
    if (now_ms >= q.deadline_ms) stranded += static_cast<int64_t>(q.block_ids.size());
  }
  return stranded;
}

}  // namespace kvmesh::kv
