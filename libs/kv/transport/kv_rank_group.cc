#include "kv/transport/kv_rank_group.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv {

namespace {

// The ranks' verdicts on one transfer, reported once, after the last rank's: a push's
// source blocks stay read until every rank is done, and a lease's blocks are written
// until then. The first failure wins; `on_first_failure` runs once, when it arrives,
// so the other ranks stop early.
//
// Thread-safety: thread-safe (each rank reports from its transport's thread).
class RankJoin {
 public:
  RankJoin(int32_t ranks, std::function<void(const absl::Status&, const KvTransferStats&)> on_done,
           std::function<void(const absl::Status&)> on_first_failure)
      : remaining_(ranks), on_done_(std::move(on_done)), on_first_failure_(std::move(on_first_failure)) {}

  void Report(int32_t rank, const absl::Status& status, const KvTransferStats& stats) {
    std::function<void(const absl::Status&)> hook;
    std::function<void(const absl::Status&, const KvTransferStats&)> done;
    absl::Status error;
    KvTransferStats sum;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sum_.bytes += stats.bytes;
      sum_.descriptors += stats.descriptors;
      sum_.runs += stats.runs;
      sum_.blocks += stats.blocks;
      sum_.seconds = std::max(sum_.seconds, stats.seconds);
      if (!status.ok() && error_.ok()) {
        error_ = absl::Status(status.code(), absl::StrCat("rank ", rank, ": ", status.message()));
        hook = std::move(on_first_failure_);
      }
      if (--remaining_ == 0) {
        done = std::move(on_done_);
        error = error_;
        sum = sum_;
      }
    }
    if (hook) hook(status);
    if (done) done(error, sum);
  }

  // The group never formed (a rank could not be opened): nothing is reported, and the
  // `never_opened` ranks that will not report are not waited for.
  void Abandon(int32_t never_opened) {
    std::lock_guard<std::mutex> lock(mu_);
    on_done_ = nullptr;
    on_first_failure_ = nullptr;
    remaining_ -= never_opened;
  }

 private:
  std::mutex mu_;
  int32_t remaining_;                                                         // guarded by mu_
  KvTransferStats sum_;                                                       // guarded by mu_
  absl::Status error_;                                                        // guarded by mu_
  std::function<void(const absl::Status&, const KvTransferStats&)> on_done_;  // guarded by mu_
  std::function<void(const absl::Status&)> on_first_failure_;                 // guarded by mu_
};

// The ranks' releases of one group lease (KvLeaseOptions::on_released): the group's runs
// after the last. Thread-safety: thread-safe.
class ReleaseJoin {
 public:
  ReleaseJoin(int32_t ranks, KvLeaseReleasedFn on_released) : remaining_(ranks), on_released_(std::move(on_released)) {}

  void Report() {
    KvLeaseReleasedFn released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--remaining_ == 0) released = std::move(on_released_);
    }
    if (released) released();
  }
  void Abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    on_released_ = nullptr;
  }

 private:
  std::mutex mu_;
  int32_t remaining_;                // guarded by mu_
  KvLeaseReleasedFn on_released_;    // guarded by mu_
};

}  // namespace

absl::StatusOr<KvRankGroupGrant> OpenRankGroupLease(std::span<const KvRankPool> ranks,
                                                    const std::vector<BlockId>& block_ids, KvLeaseDoneFn on_done,
                                                    KvLeaseReleasedFn on_released) {
  if (ranks.empty()) return absl::InvalidArgumentError("a rank group lease needs at least one rank");
  KvRankGroupGrant grant;
  // The tokens are known only as the leases open; the hook reads them under its own lock.
  auto tokens = std::make_shared<std::pair<std::mutex, std::vector<uint64_t>>>();
  std::vector<KvRankPool> pools(ranks.begin(), ranks.end());
  auto join = std::make_shared<RankJoin>(
      static_cast<int32_t>(ranks.size()), std::move(on_done), [pools, tokens](const absl::Status& status) {
        std::vector<uint64_t> open;
        {
          std::lock_guard<std::mutex> lock(tokens->first);
          open = tokens->second;
        }
        // The other ranks' senders are refused from now on; a rank already closed ignores it.
        CloseRankGroupLease(pools, open, status);
      });
  // The last rank's release releases the group; a group that never formed releases nothing.
  auto released = std::make_shared<ReleaseJoin>(static_cast<int32_t>(ranks.size()), std::move(on_released));
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<KvLeaseGrant> lease = ranks[r].transport->OpenLease(
        ranks[r].pool, {.block_ids = block_ids, .on_released = [released] { released->Report(); }},
        [join, r](const absl::Status& status, const KvTransferStats& stats) {
          join->Report(static_cast<int32_t>(r), status, stats);
        });
    if (!lease.ok()) {
      // The leases already open report Cancelled into the join; the caller hears of the
      // failure from the return value only.
      join->Abandon(static_cast<int32_t>(ranks.size() - r));
      released->Abandon();
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
  auto join = std::make_shared<RankJoin>(tp_size(), std::move(on_done), [raw](const absl::Status&) {
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
