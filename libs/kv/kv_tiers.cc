#include "kv/kv_tiers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace kvmesh::kv {

namespace {

std::vector<std::unique_ptr<KvConnector>> OneOrNone(std::unique_ptr<KvConnector> connector) {
  std::vector<std::unique_ptr<KvConnector>> out;
  if (connector != nullptr) out.push_back(std::move(connector));
  return out;
}

}  // namespace

KvTiers::KvTiers(std::unique_ptr<HostKvTier> host, std::vector<std::unique_ptr<KvConnector>> connectors,
                 int32_t block_size_tokens, bool record_events)
    : host_(std::move(host)), block_size_tokens_(block_size_tokens), record_events_(record_events) {
  lanes_.reserve(connectors.size());
  for (std::unique_ptr<KvConnector>& c : connectors) lanes_.push_back(Lane{.connector = std::move(c)});
}

KvTiers::KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<KvConnector> connector, int32_t block_size_tokens,
                 bool record_events)
    : KvTiers(std::move(host), OneOrNone(std::move(connector)), block_size_tokens, record_events) {}

DiskKvTier* KvTiers::disk() {
  for (Lane& lane : lanes_) {
    if (auto* disk = dynamic_cast<DiskKvTier*>(lane.connector.get()); disk != nullptr) return disk;
  }
  return nullptr;
}

const DiskKvTier* KvTiers::disk() const { return const_cast<KvTiers*>(this)->disk(); }

void KvTiers::OnDeviceCache(BlockId block, const BlockHash& hash, const BlockHash& parent_hash) {
  if (write_through_) OnDeviceEvict(block, hash, parent_hash);  // a full cached block never changes: copy it now
}

void KvTiers::OnDeviceEvict(BlockId block, const BlockHash& hash, const BlockHash& parent_hash) {
  if (host_->Contains(hash)) return;  // already offloaded (or on its way)
  absl::StatusOr<HostSlot> slot = host_->BeginStore(hash, parent_hash);
  if (!slot.ok()) {
    ++stats_.offload_skipped;
    stats_.offload_skipped_held_slots += held_slots_;
    for (const Lane& lane : lanes_) {
      stats_.offload_skipped_write_slots += static_cast<int64_t>(lane.saves.size() + lane.save_backlog.size());
    }
    stats_.offload_skipped_copy_slots +=
        static_cast<int64_t>(host_->num_filling()) + static_cast<int64_t>(pending_.in.size()) + lookup_pins_;
    return;
  }
  pending_.out.push_back(KvSwap{.block = block, .slot = *slot, .host = host_->data(*slot).data()});
}

double KvTiers::LoadSeconds(int64_t num_blocks, double bytes_per_second) const {
  return bytes_per_second <= 0 ? 0 : static_cast<double>(num_blocks * host_->slot_bytes()) / bytes_per_second;
}

bool KvTiers::LoadBeatsRecompute(int64_t num_blocks, double load_seconds) const {
  if (load_seconds <= 0 || prefill_tokens_per_second_ <= 0) return true;  // not measured yet
  const double recompute_s = static_cast<double>(num_blocks * block_size_tokens_) / prefill_tokens_per_second_;
  return load_seconds < recompute_s;
}

KvTiers::Lane* KvTiers::LaneHolding(const BlockHash& hash) {
  for (Lane& lane : lanes_) {
    if (lane.connector->Contains(hash)) return &lane;
  }
  return nullptr;
}

KvConnectorHits KvTiers::ExtendPrefix(std::span<const BlockHash> hashes, size_t first, size_t limit,
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
  const auto num_found = static_cast<int64_t>(found.size());
  if (!found.empty() && !LoadBeatsRecompute(num_found, LoadSeconds(num_found, host_->stats().read_bytes_per_second))) {
    ++stats_.recompute_decisions;
    for (const HostSlot s : found) host_->Unpin(s);
    return {};
  }
  if (!found.empty()) ++stats_.load_decisions;
  lookup_pins_ += static_cast<int32_t>(found.size());
  host_slots->insert(host_slots->end(), found.begin(), found.end());
  if (lanes_.empty()) return {};
  // A block being loaded for another owner ends the run: this owner finds it as a host
  // hit once it lands.
  size_t end = i;
  while (end < limit && !loading_.contains(hashes[end])) ++end;
  // Each block from the first connector that holds it: a connector's run ends where it
  // misses, and another may continue it (the one that just matched is not asked again).
  KvConnectorHits hits;
  double load_seconds = 0;
  bool unmeasured = false;
  const Lane* last = nullptr;
  while (i < end) {
    const Lane* matched = nullptr;
    for (Lane& lane : lanes_) {
      if (&lane == last) continue;
      const KvConnectorMatch m = lane.connector->Match(hashes, i, end);
      hits.pending = hits.pending || m.pending;
      if (m.num_blocks <= 0) continue;
      matched = &lane;
      i += static_cast<size_t>(m.num_blocks);
      hits.num_blocks += m.num_blocks;
      const double s = LoadSeconds(m.num_blocks, lane.connector->stats().read_bytes_per_second);
      unmeasured = unmeasured || s <= 0;
      load_seconds += s;
      break;
    }
    if (matched == nullptr || lanes_.size() == 1) break;
    last = matched;
  }
  if (hits.pending) ++stats_.lookups_pending;
  if (hits.num_blocks > 0 && !unmeasured && !LoadBeatsRecompute(hits.num_blocks, load_seconds)) {
    // NOTE: a measurement only changes by loading; every kReprobeEvery-th hit that
    // recomputing would win is loaded anyway, so one slow sample cannot rule a
    // connector out for good.
    if (++connector_recompute_streak_ < kReprobeEvery) {
      ++stats_.recompute_decisions;
      return {.pending = hits.pending};
    }
  }
  if (hits.num_blocks > 0) {
    connector_recompute_streak_ = 0;
    ++stats_.load_decisions;
  }
  return hits;
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
  for (Lane& lane : lanes_) StartSave(lane, slot);
}

void KvTiers::StartSave(Lane& lane, HostSlot slot) {
  KvConnector& c = *lane.connector;
  if (c.Contains(host_->hash(slot))) return;
  if (!lane.save_backlog.empty() || !c.CanStartSave()) {
    // NOTE: the queue is busy (a burst of evictions, or loads holding it): wait for
    // room rather than drop the block, which would leave a hole in the connector's copy
    // of the prefix and cut every later hit short at it.
    const size_t max_backlog = std::min<size_t>(kMaxWriteBacklog, static_cast<size_t>(host_->num_slots() / 2));
    if (lane.save_backlog.size() >= max_backlog) {
      ++stats_.writes_skipped;
      return;
    }
    host_->Pin(slot);
    lane.save_backlog.push_back(slot);
    ++stats_.writes_queued;
    return;
  }
  absl::StatusOr<int64_t> ticket =
      c.StartSave(host_->hash(slot), host_->parent_hash(slot), host_->data(slot), host_->checksum(slot));
  if (!ticket.ok()) return;  // already held, declined, or no room: the host copy is enough
  host_->Pin(slot);
  lane.saves[*ticket] = slot;
}

bool KvTiers::SubmitLoad(Lane& lane, const Read& read) {
  absl::StatusOr<int64_t> ticket = lane.connector->StartLoad(read.hash, host_->data(read.slot));
  if (!ticket.ok()) return false;
  lane.loads[*ticket] = read;
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

void KvTiers::SubmitBacklog(Lane& lane) {
  KvConnector& c = *lane.connector;
  // Loads first: a request is waiting for them; a save only makes a later hit possible.
  while (!lane.load_backlog.empty() && c.CanStartLoad()) {
    const Read r = lane.load_backlog.front();
    lane.load_backlog.pop_front();
    if (SubmitLoad(lane, r)) continue;
    // The block went (evicted or dropped) while the load waited: recompute it.
    ++stats_.reads_lost;
    host_->AbortStore(r.slot);
    loading_.erase(r.hash);
    UnreserveRead(r);
  }
  while (!lane.save_backlog.empty() && c.CanStartSave()) {
    const HostSlot slot = lane.save_backlog.front();
    lane.save_backlog.pop_front();
    absl::StatusOr<int64_t> ticket =
        c.Contains(host_->hash(slot))
            ? absl::StatusOr<int64_t>(absl::AlreadyExistsError("held"))
            : c.StartSave(host_->hash(slot), host_->parent_hash(slot), host_->data(slot), host_->checksum(slot));
    if (ticket.ok()) {
      lane.saves[*ticket] = slot;  // the backlog's pin passes to the save
    } else {
      host_->Unpin(slot);  // held already, or no room: the host copy is enough
    }
  }
}

KvLoadStart KvTiers::StartLoads(RequestId owner, std::span<const BlockHash> hashes, size_t first, size_t n,
                                 std::span<const HostSlot> host_hits) {
  if (lanes_.empty() || first >= hashes.size()) return {};
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
    Lane* lane = LaneHolding(hashes[i]);
    if (lane == nullptr) break;  // gone from every connector since the lookup: recompute the rest
    const BlockHash& parent = i == 0 ? kRootBlockHash : hashes[i - 1];
    absl::StatusOr<HostSlot> slot = host_->BeginStore(hashes[i], parent);
    if (!slot.ok()) break;  // host full of pinned slots: recompute the rest
    const Read read{.slot = *slot, .hash = hashes[i], .owner = owner, .hold_id = hold.id};
    if (lane->load_backlog.empty() && lane->connector->CanStartLoad()) {
      if (!SubmitLoad(*lane, read)) {  // not held after all: recompute from here
        host_->AbortStore(*slot);
        break;
      }
    } else {
      // NOTE: a busy queue makes the load wait (Poll submits it), never a recompute.
      lane->load_backlog.push_back(read);
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
  for (Lane& lane : lanes_) {
    if (!record_events_) (void)lane.connector->DrainEvents();  // nobody consumes them: keep the queue empty
    if (!lane.busy()) continue;
    FinishIo(lane, lane.connector->Poll());
    SubmitBacklog(lane);
  }
}

void KvTiers::FinishIo(Lane& lane, std::span<const KvIoCompletion> completions) {
  for (const KvIoCompletion& c : completions) {
    if (c.kind == KvIoCompletion::Kind::kRead) {
      FinishLoad(lane, c);
    } else if (const auto it = lane.saves.find(c.ticket); it != lane.saves.end()) {
      host_->Unpin(it->second);
      lane.saves.erase(it);
    }
  }
}

void KvTiers::FinishLoad(Lane& lane, const KvIoCompletion& c) {
  const absl::Status& status = c.status;
  const auto it = lane.loads.find(c.ticket);
  if (it == lane.loads.end()) return;
  const Read& read = it->second;
  const auto hold = holds_.find(read.owner);
  const bool held = hold != holds_.end() && hold->second.id == read.hold_id;
  if (status.ok()) {
    host_->CommitStore(read.slot, c.checksum);  // the connector verified the bytes against it
    if (held) {  // its reservation becomes the pin
      host_->Pin(read.slot);
      hold->second.slots.push_back(read.slot);
      --hold->second.reads_pending;
    }
  } else {
    KVMESH_LOG(kWarning) << lane.connector->name() << " KV tier: " << status.message() << ": recomputing the block";
    host_->AbortStore(read.slot);
    UnreserveRead(read);
  }
  loading_.erase(read.hash);
  lane.loads.erase(it);
}

void KvTiers::DrainConnectors() {
  for (Lane& lane : lanes_) {
    while (lane.busy()) {
      // Waits for what is in flight, then submits the backlog into the room it freed.
      const int32_t in_flight = lane.connector->num_in_flight();
      FinishIo(lane, lane.connector->Drain());
      SubmitBacklog(lane);
      if (in_flight == 0 && lane.connector->num_in_flight() == 0) break;  // no room will ever free
    }
  }
}

uint64_t KvTiers::lookups_answered() const {
  uint64_t answered = 0;
  for (const Lane& lane : lanes_) answered += lane.connector->num_lookups_answered();
  return answered;
}

std::vector<KvEvent> KvTiers::DrainEvents() {
  std::vector<KvEvent> events = host_->DrainEvents();
  for (Lane& lane : lanes_) {
    std::vector<KvEvent> more = lane.connector->DrainEvents();
    events.insert(events.end(), more.begin(), more.end());
  }
  return events;
}

absl::Status KvTiers::CheckInvariants() const {
  if (absl::Status s = host_->CheckInvariants(); !s.ok()) return s;
  for (const Lane& lane : lanes_) {
    if (absl::Status s = lane.connector->CheckInvariants(); !s.ok()) return s;
  }
  // Pins nest, so count pin holders per slot against the slots' pinned flags.
  absl::flat_hash_map<int32_t, int32_t> holders;
  for (const KvSwap& s : pending_.in) ++holders[s.slot.value];
  size_t loads = 0;
  for (const Lane& lane : lanes_) {
    for (const auto& [ticket, slot] : lane.saves) ++holders[slot.value];
    for (const HostSlot slot : lane.save_backlog) ++holders[slot.value];
    loads += lane.loads.size() + lane.load_backlog.size();
  }
  int32_t held = 0;
  for (const auto& [owner, hold] : holds_) {
    for (const HostSlot slot : hold.slots) ++holders[slot.value];
    held += static_cast<int32_t>(hold.slots.size()) + hold.reads_pending;
    int32_t reads = 0;
    for (const Lane& lane : lanes_) {
      for (const auto& [ticket, r] : lane.loads) reads += r.owner == owner && r.hold_id == hold.id ? 1 : 0;
      for (const Read& r : lane.load_backlog) reads += r.owner == owner && r.hold_id == hold.id ? 1 : 0;
    }
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
  if (loading_.size() != loads) {
    return absl::InternalError(
        absl::StrCat("KV tiers: ", loading_.size(), " blocks loading but ", loads, " connector loads running or queued"));
  }
  for (const Lane& lane : lanes_) {
    if (!lane.load_backlog.empty() && lane.connector->num_in_flight() == 0) {
      return absl::InternalError(
          absl::StrCat("KV tiers: loads wait in the ", std::string(lane.connector->name()), " backlog while its queue is idle"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
