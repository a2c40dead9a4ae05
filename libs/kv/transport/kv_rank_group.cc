#include "kv/transport/kv_rank_group.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv {

// The ranks' verdicts on one transfer, reported once, after the last rank's: a push's
// source blocks stay read until every rank is done, and a lease's blocks are written
// until then. The first failure wins; `on_first_failure` runs once, when it arrives,
// so the other ranks stop early.
struct KvRankGroupPush::Join {
  Join(int32_t ranks, std::function<void(const absl::Status&, const KvTransferStats&)> done,
       std::function<void(const absl::Status&)> on_first_failure)
      : remaining(ranks), on_done(std::move(done)), first_failure_hook(std::move(on_first_failure)) {}

  void Report(int32_t rank, const absl::Status& status, const KvTransferStats& stats) {
    std::function<void(const absl::Status&)> hook;
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu);
      sum.bytes += stats.bytes;
      sum.descriptors += stats.descriptors;
      sum.runs += stats.runs;
      sum.blocks += stats.blocks;
      sum.seconds = std::max(sum.seconds, stats.seconds);
      if (!status.ok() && error.ok()) {
        error = absl::Status(status.code(), absl::StrCat("rank ", rank, ": ", status.message()));
        hook = std::move(first_failure_hook);
      }
      last = --remaining == 0;
    }
    if (hook) hook(status);
    if (!last) return;
    // Moved out: its captures (the caller's) go with this call.
    auto done = std::move(on_done);
    done(error, sum);
  }

  std::mutex mu;
  int32_t remaining;                                                       // guarded by mu
  KvTransferStats sum;                                                     // guarded by mu
  absl::Status error;                                                      // guarded by mu
  std::function<void(const absl::Status&, const KvTransferStats&)> on_done;  // run once, by the last
  std::function<void(const absl::Status&)> first_failure_hook;             // guarded by mu
};

absl::StatusOr<KvRankGroupGrant> OpenRankGroupLease(std::span<const KvRankPool> ranks,
                                                    const std::vector<BlockId>& block_ids, KvLeaseDoneFn on_done) {
  if (ranks.empty()) return absl::InvalidArgumentError("a rank group lease needs at least one rank");
  KvRankGroupGrant grant;
  // The tokens are known only as the leases open; the hook reads them under its own lock.
  auto tokens = std::make_shared<std::pair<std::mutex, std::vector<uint64_t>>>();
  std::vector<KvRankPool> pools(ranks.begin(), ranks.end());
  auto join = std::make_shared<KvRankGroupPush::Join>(
      static_cast<int32_t>(ranks.size()), std::move(on_done), [pools, tokens](const absl::Status& status) {
        std::vector<uint64_t> open;
        {
          std::lock_guard<std::mutex> lock(tokens->first);
          open = tokens->second;
        }
        // The other ranks' senders are refused from now on; a rank already closed ignores it.
        CloseRankGroupLease(pools, open, status);
      });
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<KvLeaseGrant> lease = ranks[r].transport->OpenLease(
        ranks[r].pool, {.block_ids = block_ids},
        [join, r](const absl::Status& status, const KvTransferStats& stats) {
          join->Report(static_cast<int32_t>(r), status, stats);
        });
    if (!lease.ok()) {
      // The leases already open report Cancelled into the join, whose on_done then runs
      // with it: the caller sees the error both ways, so drop its callback first.
      {
        std::lock_guard<std::mutex> lock(join->mu);
        join->on_done = [](const absl::Status&, const KvTransferStats&) {};
        join->first_failure_hook = nullptr;
        join->remaining -= static_cast<int32_t>(ranks.size() - r);  // the ranks never opened
      }
      CloseRankGroupLease(ranks, grant.lease_tokens, absl::CancelledError("another rank's lease was refused"));
      return absl::Status(lease.status().code(), absl::StrCat("rank ", r, ": ", lease.status().message()));
    }
    grant.lease_tokens.push_back(lease->lease_token);
    grant.descriptors.push_back(std::move(lease->descriptor));
    std::lock_guard<std::mutex> lock(tokens->first);
    tokens->second.push_back(lease->lease_token);
  }
  return grant;
}

void CloseRankGroupLease(std::span<const KvRankPool> ranks, const std::vector<uint64_t>& lease_tokens,
                         const absl::Status& status) {
  for (size_t r = 0; r < lease_tokens.size() && r < ranks.size(); ++r) {
    ranks[r].transport->CloseLease(lease_tokens[r], status);
  }
}

absl::StatusOr<std::unique_ptr<KvRankGroupPush>> KvRankGroupPush::Open(std::span<const KvRankPool> ranks,
                                                                       std::span<const std::string> descriptors) {
  if (ranks.empty()) return absl::InvalidArgumentError("a rank group push needs at least one rank");
  if (descriptors.size() != ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the receiver granted KV leases for ", descriptors.size(),
                                                   " tensor-parallel ranks; this worker has ", ranks.size()));
  }
  std::vector<std::unique_ptr<KvPush>> pushes;
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::unique_ptr<KvPush>> push = ranks[r].transport->OpenPush(ranks[r].pool, descriptors[r]);
    if (!push.ok()) {
      for (auto& p : pushes) p->Cancel();
      return absl::Status(push.status().code(), absl::StrCat("rank ", r, ": ", push.status().message()));
    }
    pushes.push_back(*std::move(push));
  }
  return std::unique_ptr<KvRankGroupPush>(new KvRankGroupPush(std::move(pushes)));
}

KvRankGroupPush::KvRankGroupPush(std::vector<std::unique_ptr<KvPush>> pushes) : pushes_(std::move(pushes)) {}

// Each push abandons its transfer when dropped unfinished (KvPush); a finishing one
// still reports into the join.
KvRankGroupPush::~KvRankGroupPush() = default;

absl::Status KvRankGroupPush::PutLayer(int32_t rank, int32_t layer, int32_t first_index,
                                       std::span<const BlockId> src_blocks) {
  if (rank < 0 || rank >= tp_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the group's ", tp_size()));
  }
  return pushes_[static_cast<size_t>(rank)]->PutLayer(layer, first_index, src_blocks);
}

void KvRankGroupPush::Finish(KvPushDoneFn on_done) {
  // NOTE: the hook cancels through raw pointers: the pushes live as long as this object,
  // and the caller keeps it until on_done (which runs after every rank reported).
  std::vector<KvPush*> raw;
  for (auto& p : pushes_) raw.push_back(p.get());
  auto join = std::make_shared<Join>(tp_size(), std::move(on_done), [raw](const absl::Status&) {
    for (KvPush* p : raw) p->Cancel();  // a push already done ignores it
  });
  for (size_t r = 0; r < pushes_.size(); ++r) {
    pushes_[r]->Finish([join, r](const absl::Status& status, const KvTransferStats& stats) {
      join->Report(static_cast<int32_t>(r), status, stats);
    });
  }
}

void KvRankGroupPush::Cancel() {
  for (auto& p : pushes_) p->Cancel();
}

}  // namespace kvmesh::kv
