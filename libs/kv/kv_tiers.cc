#include "kv/kv_tiers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace kvmesh::kv {

KvTiers::KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<DiskKvTier> disk, int32_t block_size_tokens,
                 bool record_events)
    : host_(std::move(host)), disk_(std::move(disk)), block_size_tokens_(block_size_tokens),
      record_events_(record_events) {}

void KvTiers::OnDeviceCache(BlockId block, const BlockHash& hash, const BlockHash& parent_hash) {
  if (write_through_) OnDeviceEvict(block, hash, parent_hash);  // a full cached block never changes: copy it now
}

void KvTiers::OnDeviceEvict(BlockId block, const BlockHash& hash, const BlockHash& parent_hash) {
  if (host_->Contains(hash)) return;  // already offloaded (or on its way)
  absl::StatusOr<HostSlot> slot = host_->BeginStore(hash, parent_hash);
  if (!slot.ok()) {
    ++stats_.offload_skipped;
    stats_.offload_skipped_held_slots += held_slots_;
    stats_.offload_skipped_write_slots += static_cast<int64_t>(writes_.size() + write_backlog_.size());
    stats_.offload_skipped_copy_slots +=
        static_cast<int64_t>(host_->num_filling()) + static_cast<int64_t>(pending_.in.size()) + lookup_pins_;
    return;
  }
  pending_.out.push_back(KvSwap{.block = block, .slot = *slot, .host = host_->data(*slot).data()});
}

bool KvTiers::LoadBeatsRecompute(int64_t num_blocks, double bytes_per_second) const {
  if (bytes_per_second <= 0 || prefill_tokens_per_second_ <= 0) return true;  // not measured yet
  const double load_s = static_cast<double>(num_blocks * host_->slot_bytes()) / bytes_per_second;
  const double recompute_s = static_cast<double>(num_blocks * block_size_tokens_) / prefill_tokens_per_second_;
  return load_s < recompute_s;
}

int32_t KvTiers::ExtendPrefix(std::span<const BlockHash> hashes, size_t first, size_t limit,
                              std::vector<HostSlot>* host_slots) {
  size_t i = first;
  std::vector<HostSlot> found;
  for (; i < limit; ++i) {
    const std::optional<HostSlot> slot = host_->Find(hashes[i]);
    if (!slot.has_value()) break;
    if (absl::Status s = swap_ins_verified_by_copy_ ? absl::OkStatus() : host_->Verify(*slot); !s.ok()) {
      KVMESH_LOG(kWarning) << s.message() << ": recomputing it";
      break;
    }
    host_->Pin(*slot);
    found.push_back(*slot);
  }
  if (!found.empty() && !LoadBeatsRecompute(static_cast<int64_t>(found.size()), host_->stats().read_bytes_per_second)) {
    ++stats_.recompute_decisions;
    for (const HostSlot s : found) host_->Unpin(s);
    return 0;
  }
  if (!found.empty()) ++stats_.load_decisions;
  lookup_pins_ += static_cast<int32_t>(found.size());
  host_slots->insert(host_slots->end(), found.begin(), found.end());
  if (disk_ == nullptr) return 0;
  int32_t on_disk = 0;
  for (; i < limit && (on_disk == 0 || disk_->Contains(hashes[i])); ++i) {
    if (loading_.contains(hashes[i]) || !disk_->Lookup(hashes[i])) break;
    ++on_disk;
  }
  if (on_disk > 0 && !LoadBeatsRecompute(on_disk, disk_->stats().read_bytes_per_second)) {
    // NOTE: a measurement only changes by loading; every kReprobeEvery-th hit that
    // recomputing would win is loaded anyway, so one slow sample cannot rule the
    // disk out for good.
    if (++disk_recompute_streak_ < kReprobeEvery) {
      ++stats_.recompute_decisions;
      return 0;
    }
  }
  if (on_disk > 0) {
    disk_recompute_streak_ = 0;
    ++stats_.load_decisions;
  }
  return on_disk;
}

void KvTiers::Release(std::span<const HostSlot> host_slots) {
  for (const HostSlot s : host_slots) host_->Unpin(s);
  lookup_pins_ -= static_cast<int32_t>(host_slots.size());
}

void KvTiers::QueueSwapIn(BlockId block, HostSlot slot) {
  --lookup_pins_;  // the pin passes to the swap-in
  pending_.in.push_back(
      KvSwap{.block = block, .slot = slot, .host = host_->data(slot).data(), .checksum = host_->checksum(slot)});
}

KvSwaps KvTiers::TakeSwaps() { return std::exchange(pending_, {}); }

int32_t KvTiers::FinishSwaps(const KvSwaps& swaps, bool copied, double out_seconds, double in_seconds,
                             std::span<const uint64_t> out_checksums, std::span<const uint64_t> in_checksums) {
  const int64_t bytes = host_->slot_bytes();
  const bool hashed = out_checksums.size() == swaps.out.size();
  for (size_t i = 0; i < swaps.out.size(); ++i) {
    const KvSwap& s = swaps.out[i];
    if (copied) {
      host_->CommitStore(s.slot, hashed ? std::optional<uint64_t>(out_checksums[i]) : std::nullopt);
      StartWriteThrough(s.slot);
    } else {
      host_->AbortStore(s.slot);
    }
  }
  if (copied && !swaps.out.empty()) {
    host_->RecordOffload(static_cast<int64_t>(swaps.out.size()), static_cast<int64_t>(swaps.out.size()) * bytes,
                         out_seconds);
  }
  const bool verify_in = copied && in_checksums.size() == swaps.in.size();
  int32_t mismatches = 0;
  for (size_t i = 0; i < swaps.in.size(); ++i) {
    const KvSwap& s = swaps.in[i];
    host_->Unpin(s.slot);
    if (!verify_in) continue;
    if (absl::Status v = host_->Verify(s.slot, in_checksums[i]); !v.ok()) {
      KVMESH_LOG(kWarning) << v.message() << " as it was onboarded: recomputing it";
      ++mismatches;
    }
  }
  if (copied && !swaps.in.empty()) {
    host_->RecordOnboard(static_cast<int64_t>(swaps.in.size()), static_cast<int64_t>(swaps.in.size()) * bytes,
                         in_seconds);
  }
  return mismatches;
}

void KvTiers::StartWriteThrough(HostSlot slot) {
  if (disk_ == nullptr || disk_->Contains(host_->hash(slot))) return;
  if (!write_backlog_.empty() || !disk_->CanStartWrite()) {
    // NOTE: the queue is busy (a burst of evictions, or reads holding it): wait for
    // room rather than drop the block, which would leave a hole in the disk's copy of
    // the prefix and cut every later disk hit short at it.
    const size_t max_backlog = std::min<size_t>(kMaxWriteBacklog, static_cast<size_t>(host_->num_slots() / 2));
    if (write_backlog_.size() >= max_backlog) {
      ++stats_.writes_skipped;
      return;
    }
    host_->Pin(slot);
    write_backlog_.push_back(slot);
    ++stats_.writes_queued;
    return;
  }
  absl::StatusOr<int64_t> ticket =
      disk_->StartWrite(host_->hash(slot), host_->parent_hash(slot), host_->data(slot), host_->checksum(slot));
  if (!ticket.ok()) return;  // already held, or no slot / memory: the host copy is enough
  host_->Pin(slot);
  writes_[*ticket] = slot;
}

bool KvTiers::SubmitRead(const Read& read) {
  absl::StatusOr<int64_t> ticket = disk_->StartRead(read.hash, host_->data(read.slot));
  if (!ticket.ok()) return false;
  reads_[*ticket] = read;
  return true;
}

void KvTiers::UnreserveRead(const Read& read) {
  const auto hold = holds_.find(read.owner);
  if (hold == holds_.end() || hold->second.id != read.hold_id) return;  // released: nothing reserved
  --hold->second.reads_pending;
  --held_slots_;
  if (hold->second.slots.empty() && hold->second.reads_pending == 0) holds_.erase(hold);
}

int32_t KvTiers::max_held_slots() const {
  return std::max<int32_t>(1, static_cast<int32_t>(load_hold_share_ * host_->num_slots()));
}

void KvTiers::SubmitBacklog() {
  // Reads first: a request is waiting for them; a write only makes a later hit possible.
  while (!read_backlog_.empty() && disk_->CanStartRead()) {
    const Read r = read_backlog_.front();
    read_backlog_.pop_front();
    if (SubmitRead(r)) continue;
    // The record went (evicted or dropped) while the read waited: recompute the block.
    ++stats_.reads_lost;
    host_->AbortStore(r.slot);
    loading_.erase(r.hash);
    UnreserveRead(r);
  }
  while (!write_backlog_.empty() && disk_->CanStartWrite()) {
    const HostSlot slot = write_backlog_.front();
    write_backlog_.pop_front();
    absl::StatusOr<int64_t> ticket =
        disk_->Contains(host_->hash(slot))
            ? absl::StatusOr<int64_t>(absl::AlreadyExistsError("held"))
            : disk_->StartWrite(host_->hash(slot), host_->parent_hash(slot), host_->data(slot), host_->checksum(slot));
    if (ticket.ok()) {
      writes_[*ticket] = slot;  // the backlog's pin passes to the write
    } else {
      host_->Unpin(slot);  // held already, or no disk slot: the host copy is enough
    }
  }
}

DiskLoadStart KvTiers::StartDiskLoads(RequestId owner, std::span<const BlockHash> hashes, size_t first, size_t n,
                                     std::span<const HostSlot> host_hits) {
  if (disk_ == nullptr || first >= hashes.size()) return {};
  n = std::min(n, hashes.size() - first);
  const auto existing = holds_.find(owner);
  const bool holds_already = existing != holds_.end();
  // A second load's lookup finds what the first one holds as host hits: hold only the new ones.
  absl::flat_hash_set<int32_t> mine;
  if (holds_already) {
    for (const HostSlot s : existing->second.slots) mine.insert(s.value);
  }
  std::vector<HostSlot> new_hits;
  for (const HostSlot s : host_hits) {
    if (mine.insert(s.value).second) new_hits.push_back(s);
  }
  const auto hits = static_cast<int32_t>(new_hits.size());
  const int32_t room = max_held_slots() - held_slots_;
  // NOTE: blocks already resident or being read for another owner need no new slot but
  // are counted in `need` anyway: a bound, not an exact count, is enough to decide.
  const int32_t need = hits + static_cast<int32_t>(n);
  if (need > room && !holds_already && held_slots_ > 0) {
    // 2. Wait for the holders ahead to be admitted: loading a part now and recomputing
    // the rest would throw away what waiting a little longer saves.
    ++stats_.loads_deferred;
    return {.deferred = true};
  }
  if (hits > room) {
    // 3. Not even the hits fit: hold nothing; the owner goes ahead with its lookup's
    // pins and recomputes the disk part.
    stats_.load_blocks_cut += static_cast<int64_t>(n);
    return {};
  }
  const size_t max_reads = std::min(n, static_cast<size_t>(room - hits));
  // NOTE: the hits are held first, so the loads below cannot evict them for room.
  Hold& hold = holds_[owner];
  if (!holds_already) hold.id = next_hold_id_++;
  for (const HostSlot s : new_hits) {
    host_->Pin(s);
    hold.slots.push_back(s);
  }
  held_slots_ += hits;
  int32_t covered = 0, started = 0;
  for (size_t i = first; i < first + max_reads; ++i, ++covered) {
    if (loading_.contains(hashes[i])) continue;  // another owner's read brings it
    if (host_->Contains(hashes[i])) {
      // Resident already (another request loaded or offloaded it): hold it too. A slot
      // still filling (an offload in this step) lands unheld.
      if (const std::optional<HostSlot> resident = host_->Peek(hashes[i]);
          resident.has_value() && mine.insert(resident->value).second) {
        host_->Pin(*resident);
        hold.slots.push_back(*resident);
        ++held_slots_;
      }
      continue;
    }
    const BlockHash& parent = i == 0 ? kRootBlockHash : hashes[i - 1];
    absl::StatusOr<HostSlot> slot = host_->BeginStore(hashes[i], parent);
    if (!slot.ok()) break;  // host full of pinned slots: recompute the rest
    const Read read{.slot = *slot, .hash = hashes[i], .owner = owner, .hold_id = hold.id};
    if (read_backlog_.empty() && disk_->CanStartRead()) {
      if (!SubmitRead(read)) {  // not held after all: recompute from here
        host_->AbortStore(*slot);
        break;
      }
    } else {
      // NOTE: a busy queue makes the load wait (Poll submits it), never a recompute.
      read_backlog_.push_back(read);
      ++stats_.reads_queued;
    }
    loading_.insert(hashes[i]);
    ++hold.reads_pending;
    ++held_slots_;
    ++started;
  }
  if (hold.slots.empty() && hold.reads_pending == 0) holds_.erase(owner);  // else the reads land in it
  stats_.loads_started += started;
  stats_.load_blocks_cut += static_cast<int64_t>(n) - covered;
  return {.num_blocks = covered};
}

void KvTiers::ReleaseLoadHold(RequestId owner) {
  const auto it = holds_.find(owner);
  if (it == holds_.end()) return;
  for (const HostSlot s : it->second.slots) host_->Unpin(s);
  held_slots_ -= static_cast<int32_t>(it->second.slots.size()) + it->second.reads_pending;
  holds_.erase(it);
}

std::vector<std::pair<RequestId, int32_t>> KvTiers::load_holds() const {
  std::vector<std::pair<RequestId, int32_t>> out;
  out.reserve(holds_.size());
  for (const auto& [owner, hold] : holds_) {
    out.emplace_back(owner, static_cast<int32_t>(hold.slots.size()) + hold.reads_pending);
  }
  return out;
}

bool KvTiers::AnyLoading(std::span<const BlockHash> hashes) const {
  if (loading_.empty()) return false;
  for (const BlockHash& h : hashes) {
    if (loading_.contains(h)) return true;
  }
  return false;
}

void KvTiers::Poll() {
  if (disk_ == nullptr) return;
  if (!record_events_) (void)disk_->DrainEvents();  // nobody consumes them: keep the queue empty
  if (writes_.empty() && reads_.empty() && read_backlog_.empty() && write_backlog_.empty()) return;
  for (const DiskIoCompletion& c : disk_->Poll()) {
    if (c.kind == DiskIoCompletion::Kind::kWrite) {
      if (const auto it = writes_.find(c.ticket); it != writes_.end()) {
        host_->Unpin(it->second);
        writes_.erase(it);
      }
      continue;
    }
    FinishRead(c);
  }
  SubmitBacklog();
}

void KvTiers::FinishRead(const DiskIoCompletion& c) {
  const absl::Status& status = c.status;
  const auto it = reads_.find(c.ticket);
  if (it == reads_.end()) return;
  const Read& read = it->second;
  const auto hold = holds_.find(read.owner);
  const bool held = hold != holds_.end() && hold->second.id == read.hold_id;
  if (status.ok()) {
    host_->CommitStore(read.slot, c.checksum);  // the disk tier verified the bytes against it
    if (held) {  // its reservation becomes the pin
      host_->Pin(read.slot);
      hold->second.slots.push_back(read.slot);
      --hold->second.reads_pending;
    }
  } else {
    KVMESH_LOG(kWarning) << "disk KV tier: " << status.message() << ": recomputing the block";
    host_->AbortStore(read.slot);
    UnreserveRead(read);
  }
  loading_.erase(read.hash);
  reads_.erase(it);
}

void KvTiers::DrainDisk() {
  if (disk_ == nullptr) return;
  auto busy = [this] { return writes_.size() + reads_.size() + read_backlog_.size() + write_backlog_.size(); };
  while (busy() > 0) {
    const size_t before = busy();
    Poll();
    if (busy() == before) {
      // Nothing reaped without blocking: wait for the rest, then reap what Drain returned.
      for (const DiskIoCompletion& c : disk_->Drain()) {
        if (const auto w = writes_.find(c.ticket); w != writes_.end()) {
          host_->Unpin(w->second);
          writes_.erase(w);
        } else {
          FinishRead(c);
        }
      }
      SubmitBacklog();
    }
  }
}

std::vector<KvEvent> KvTiers::DrainEvents() {
  std::vector<KvEvent> events = host_->DrainEvents();
  if (disk_ != nullptr) {
    std::vector<KvEvent> disk_events = disk_->DrainEvents();
    events.insert(events.end(), disk_events.begin(), disk_events.end());
  }
  return events;
}

absl::Status KvTiers::CheckInvariants() const {
  if (absl::Status s = host_->CheckInvariants(); !s.ok()) return s;
  if (disk_ != nullptr) {
    if (absl::Status s = disk_->CheckInvariants(); !s.ok()) return s;
  }
  // Pins nest, so count pin holders per slot against the slots' pinned flags.
  absl::flat_hash_map<int32_t, int32_t> holders;
  for (const KvSwap& s : pending_.in) ++holders[s.slot.value];
  for (const auto& [ticket, slot] : writes_) ++holders[slot.value];
  for (const HostSlot slot : write_backlog_) ++holders[slot.value];
  int32_t held = 0;
  for (const auto& [owner, hold] : holds_) {
    for (const HostSlot slot : hold.slots) ++holders[slot.value];
    held += static_cast<int32_t>(hold.slots.size()) + hold.reads_pending;
    int32_t reads = 0;
    for (const auto& [ticket, r] : reads_) reads += r.owner == owner && r.hold_id == hold.id ? 1 : 0;
    for (const Read& r : read_backlog_) reads += r.owner == owner && r.hold_id == hold.id ? 1 : 0;
    if (reads != hold.reads_pending) {
      return absl::InternalError(absl::StrCat("KV tiers: owner ", owner.value, "'s hold waits for ",
                                              hold.reads_pending, " reads but ", reads, " are running"));
    }
  }
  if (held != held_slots_) {
    return absl::InternalError(absl::StrCat("KV tiers: load holds take ", held, " slots, counted ", held_slots_));
  }
  if (held_slots_ > max_held_slots()) {
    return absl::InternalError(absl::StrCat("KV tiers: load holds take ", held_slots_, " host slots, over their share ",
                                            max_held_slots()));
  }
  int32_t pinned = host_->num_pinned();
  if (lookup_pins_ == 0 && static_cast<int32_t>(holders.size()) != pinned) {
    return absl::InternalError(absl::StrCat("KV tiers: ", pinned, " host slots are pinned but ", holders.size(),
                                            " have a swap-in or disk write holding them"));
  }
  for (const auto& [slot, n] : holders) {
    if (!host_->is_pinned(HostSlot{slot})) {
      return absl::InternalError(absl::StrCat("KV tiers: host slot ", slot, " is held but not pinned"));
    }
  }
  if (loading_.size() != reads_.size() + read_backlog_.size()) {
    return absl::InternalError(absl::StrCat("KV tiers: ", loading_.size(), " blocks loading but ", reads_.size(),
                                            " disk reads in flight and ", read_backlog_.size(), " queued"));
  }
  if (disk_ != nullptr && !read_backlog_.empty() && disk_->num_in_flight() == 0) {
    return absl::InternalError("KV tiers: reads wait in the backlog while the disk queue is idle");
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
