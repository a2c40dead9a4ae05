// InMemoryKvConnector: a KvConnector (kv/kv_connector.h) over blocks in memory, for unit
// tests of the classes that drive connectors (KvTiers, the engine's load gate). Several
// connectors may share one InMemoryBlocks: two workers over one cluster store, say.
// Every Start* completes at the next Poll; InMemoryBlocks says which loads fail and
// how many Match calls answer `pending` first.
//
// Thread-safety: not thread-safe (tests drive it from one thread).
#pragma once

#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kv/checksum.h"
#include "kv/kv_connector.h"

namespace kvmesh::kv {

struct InMemoryBlocks {
  absl::flat_hash_map<BlockHash, std::vector<std::byte>> blocks;
  // Loads of these fail (Unavailable) after scribbling over half the destination.
  absl::flat_hash_set<BlockHash> fail_loads;
  // Match answers `pending` while a lookup would start at one of these (a remote lookup
  // still in flight), and this many more times for any lookup.
  absl::flat_hash_set<BlockHash> still_asking;
  int32_t pending_matches = 0;
  // num_lookups_answered: each pending Match counts as answered at once unless
  // hold_answers (a remote lookup that takes its time: the count stays).
  bool hold_answers = false;
  uint64_t lookups_answered = 0;
  int64_t matches = 0;  // Match calls
  int64_t loads = 0;  // loads completed OK
  int64_t saves = 0;
};

class InMemoryKvConnector : public KvConnector {
 public:
  // `blocks` must outlive this.
  explicit InMemoryKvConnector(InMemoryBlocks& blocks, Tier tier = Tier::kStore) : b_(blocks), tier_(tier) {}

  std::string_view name() const override { return "in-memory"; }
  Tier tier() const override { return tier_; }
  KvConnectorMatch Match(std::span<const BlockHash> hashes, size_t first, size_t limit) override {
    ++stats_.queries;
    ++b_.matches;
    if (b_.pending_matches > 0) {
      --b_.pending_matches;
      if (!b_.hold_answers) ++b_.lookups_answered;
      return {.pending = true};
    }
    int32_t n = 0;
    for (size_t i = first; i < limit && b_.blocks.contains(hashes[i]); ++i) ++n;
    const size_t next = first + static_cast<size_t>(n);
    if (n > 0) ++stats_.hits;
    return {.num_blocks = n, .pending = next < limit && b_.still_asking.contains(hashes[next])};
  }
  uint64_t num_lookups_answered() const override { return b_.lookups_answered; }
  bool Contains(const BlockHash& hash) const override { return b_.blocks.contains(hash); }
  bool CanStartLoad() const override { return true; }
  bool CanStartSave() const override { return true; }  // declining is StartSave's answer
  absl::StatusOr<int64_t> StartLoad(const BlockHash& hash, std::span<std::byte> dst) override {
    const auto it = b_.blocks.find(hash);
    if (it == b_.blocks.end()) return absl::NotFoundError("not held");
    KvIoCompletion c{.ticket = next_ticket_++, .kind = KvIoCompletion::Kind::kRead, .hash = hash};
    if (b_.fail_loads.contains(hash)) {
      c.status = absl::UnavailableError("the peer went away");
      std::memset(dst.data(), 0xEE, dst.size() / 2);  // a failed load may have written part of the slot
    } else if (it->second.size() != dst.size()) {
      c.status = absl::InvalidArgumentError("block of another size");
    } else {
      std::memcpy(dst.data(), it->second.data(), dst.size());
      c.bytes = static_cast<int64_t>(dst.size());
      c.checksum = Checksum(dst);
      ++b_.loads;
    }
    done_.push_back(c);
    return c.ticket;
  }
  absl::StatusOr<int64_t> StartSave(const BlockHash& hash, const BlockHash&, std::span<const std::byte> payload,
                                    uint64_t) override {
    if (!accept_saves) return absl::ResourceExhaustedError("declined");
    if (b_.blocks.contains(hash)) return absl::AlreadyExistsError("held");
    b_.blocks[hash].assign(payload.begin(), payload.end());
    ++b_.saves;
    done_.push_back({.ticket = next_ticket_++, .kind = KvIoCompletion::Kind::kWrite, .hash = hash,
                     .bytes = static_cast<int64_t>(payload.size())});
    return done_.back().ticket;
  }
  std::vector<KvIoCompletion> Poll() override { return std::exchange(done_, {}); }
  std::vector<KvIoCompletion> Drain() override { return Poll(); }
  int32_t num_in_flight() const override { return static_cast<int32_t>(done_.size()); }
  std::vector<KvEvent> DrainEvents() override { return {}; }
  const KvTierStats& stats() const override { return stats_; }
  absl::Status CheckInvariants() const override { return absl::OkStatus(); }

  bool accept_saves = true;

 private:
  InMemoryBlocks& b_;
  const Tier tier_;
  std::vector<KvIoCompletion> done_;
  int64_t next_ticket_ = 1;
  KvTierStats stats_;
};

}  // namespace kvmesh::kv
