#include "kv_store/block_store.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "kv/checksum.h"

namespace kvmesh::kv_store {
namespace {

uint64_t RandomEpoch() {
  std::random_device device;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = (static_cast<uint64_t>(device()) << 32) ^ device();
  return epoch;
}

template <typename T>
void PushDue(std::vector<T>* heap, T due) {
  heap->push_back(due);
  std::push_heap(heap->begin(), heap->end(), std::greater<T>());
}

template <typename T>
void PopDue(std::vector<T>* heap) {
  std::pop_heap(heap->begin(), heap->end(), std::greater<T>());
  heap->pop_back();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const BlockStoreOptions& options) {
  if (options.capacity_blocks < 1 || options.capacity_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block store: capacity_blocks must be in [1, 2^31), not ", options.capacity_blocks));
  }
  if (options.slot_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block store: slot_bytes must be >= 1, not ", options.slot_bytes));
  }
  if (options.lease_ms < 1 || options.intent_timeout_ms < 1 || options.max_lease_ms < options.lease_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block store: need lease_ms >= 1, intent_timeout_ms >= 1 and max_lease_ms >= lease_ms (got lease_ms ",
        options.lease_ms, ", max_lease_ms ", options.max_lease_ms, ", intent_timeout_ms ", options.intent_timeout_ms,
        ")"));
  }
  if (options.journal_events < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block store: journal_events must be >= 1, not ", options.journal_events));
  }
  const int64_t stride = (options.slot_bytes + 63) / 64 * 64;
  if (stride > std::numeric_limits<int64_t>::max() / options.capacity_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block store: ", options.capacity_blocks, " slots of ",
                                                   options.slot_bytes, " bytes overflow"));
  }
  HugePageMemory memory = AllocateHugePageMemory(stride * options.capacity_blocks);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("block store: cannot allocate ", options.capacity_blocks,
                                                     " slots of ", options.slot_bytes, " bytes"));
  }
  const uint64_t epoch = options.epoch != 0 ? options.epoch : RandomEpoch();
  return std::unique_ptr<BlockStore>(new BlockStore(options, epoch, std::move(memory)));
}

BlockStore::BlockStore(const BlockStoreOptions& options, uint64_t epoch, HugePageMemory memory)
    : epoch_(epoch),
      capacity_(static_cast<int32_t>(options.capacity_blocks)),
      slot_bytes_(options.slot_bytes),
      stride_bytes_(static_cast<size_t>((options.slot_bytes + 63) / 64 * 64)),
      lease_(absl::Milliseconds(options.lease_ms)),
      max_lease_(absl::Milliseconds(options.max_lease_ms)),
      intent_timeout_(absl::Milliseconds(options.intent_timeout_ms)),
      clock_(options.clock != nullptr ? *options.clock : Clock::Real()),
      memory_(std::move(memory)),
      slots_(static_cast<size_t>(capacity_)),
      journal_(static_cast<size_t>(options.journal_events)) {
  free_.reserve(static_cast<size_t>(capacity_));
  // Handed out from the back: slot 0 first.
  for (int32_t i = capacity_ - 1; i >= 0; --i) free_.push_back(i);
  counters_.epoch = epoch_;
  counters_.capacity_blocks = capacity_;
  counters_.slot_bytes = slot_bytes_;
}

LookupResult BlockStore::Lookup(std::span<const StoreKey> keys) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  ExpireLocked(now);
  ++counters_.lookups;
  counters_.queried_blocks += static_cast<int64_t>(keys.size());
  LookupResult result;
  std::vector<int32_t> run;
  for (const StoreKey& key : keys) {
    const auto it = index_.find(key);
    if (it == index_.end() || slots_[it->second].state != SlotState::kCommitted) break;
    run.push_back(it->second);
  }
  result.num_present = static_cast<int32_t>(run.size());
  counters_.hit_blocks += result.num_present;
  if (run.empty()) return result;

  const absl::Time lease_end = now + lease_;
  Lease lease{.expires = lease_end, .slots = {}};
  // NOTE: touched tail first, so the chain's head is the most recently used: eviction
  // takes a chain's tail before its head, and what stays is still a leading run. Head
  // first, a store a little smaller than its working set evicted every chain's first
  // block just before it was asked for, and nothing hit at all (tools/bench-kv-store).
  for (auto it = run.rbegin(); it != run.rend(); ++it) {
    TouchLocked(*it);
    if (TryPinLocked(*it, now, lease_end)) lease.slots.push_back(*it);
  }
  const uint64_t id = next_lease_id_++;
  leases_.emplace(id, std::move(lease));
  PushDue(&lease_due_, Due{.at = lease_end, .id = id});
  result.lease = LeaseId{id};
  result.lease_expires = lease_end;
  return result;
}

bool BlockStore::Release(LeaseId lease) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  ExpireLocked(now);
  if (!leases_.contains(lease.value)) return false;
  EndLeaseLocked(lease.value, now);
  return true;
}

absl::StatusOr<PutIntentResult> BlockStore::PutIntent(std::span<const StoreKey> keys, int64_t block_bytes) {
  if (block_bytes < 1 || block_bytes > slot_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_bytes ", block_bytes, " is not in [1, ", slot_bytes_, "] (this store's slot size)"));
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  ExpireLocked(now);
  PutIntentResult result;
  result.deadline = now + intent_timeout_;
  result.blocks.reserve(keys.size());
  for (const StoreKey& key : keys) {
    if (const auto it = index_.find(key); it != index_.end()) {
      Slot& s = slots_[it->second];
      if (s.state == SlotState::kCommitted) {
        TouchLocked(it->second);  // a writer has it too: it is in use
        result.blocks.push_back({.outcome = IntentOutcome::kPresent});
      } else {
        result.blocks.push_back({.outcome = IntentOutcome::kBusy});
      }
      continue;
    }
    const int32_t slot = TakeSlotLocked();
    if (slot < 0) {
      result.blocks.push_back({.outcome = IntentOutcome::kNoSpace});
      continue;
    }
    Slot& s = slots_[slot];
    s.state = SlotState::kIntent;
    s.key = key;
    s.token = next_token_++;
    s.deadline = result.deadline;
    s.length = block_bytes;
    index_.emplace(key, slot);
    ++num_intents_;
    PushDue(&intent_due_, Due{.at = s.deadline, .id = s.token, .slot = slot});
    result.blocks.push_back({.outcome = IntentOutcome::kReserved, .token = s.token});
  }
  return result;
}

absl::Status BlockStore::Put(const StoreKey& key, uint64_t token, std::span<const std::byte> data,
                             uint64_t checksum) {
  int32_t slot = -1;
  {
    absl::ReleasableMutexLock lock(&mu_);
    ExpireLocked(clock_.Now());
    const auto it = index_.find(key);
    if (it == index_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", key.ToHex(), " has no open intent (never reserved, or expired)"));
    }
    slot = it->second;
    Slot& s = slots_[slot];
    if (s.state == SlotState::kCommitted) {
      const bool same = s.checksum == checksum && s.length == static_cast<int64_t>(data.size());
      lock.Release();
      return PutOfCommitted(key, same, data, checksum);
    }
    if (s.token != token || s.state != SlotState::kIntent) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block ", key.ToHex(), s.token != token ? " is reserved by another intent" : " is being written already"));
    }
    if (static_cast<int64_t>(data.size()) != s.length) {
      return absl::InvalidArgumentError(absl::StrCat("block ", key.ToHex(), " has ", data.size(),
                                                     " bytes; its intent declared ", s.length));
    }
    s.state = SlotState::kWriting;
  }
  // NOTE: no lock: the slot is kWriting, so nobody else reads, writes or frees it.
  std::byte* dest = SlotData(slot);
  std::memcpy(dest, data.data(), data.size());
  // The checksum of what the slot now holds, i.e. of what readers will be served.
  const uint64_t written = kv::Checksum({dest, data.size()});
  absl::MutexLock lock(&mu_);
  return FinishWriteLocked(slot, key, written, checksum);
}

absl::Status BlockStore::FinishWriteLocked(int32_t slot, const StoreKey& key, uint64_t written, uint64_t checksum) {
  const absl::Time now = clock_.Now();
  Slot& s = slots_[slot];
  if (written != checksum) {
    ++counters_.checksum_failures;
    FreeSlotLocked(slot);
    --num_intents_;
    return absl::DataLossError(absl::StrCat("block ", key.ToHex(), ": checksum mismatch (sent ", checksum,
                                            ", bytes hash to ", written, "); not committed"));
  }
  if (now > s.deadline) {
    ++counters_.expired_intents;
    FreeSlotLocked(slot);
    --num_intents_;
    return absl::DeadlineExceededError(absl::StrCat("block ", key.ToHex(), ": its intent expired during the put"));
  }
  s.state = SlotState::kCommitted;
  journal_.Stored(key);
  s.checksum = checksum;
  s.token = 0;
  s.pin_count = 0;
  s.readers = 0;
  s.window_cut = false;
  s.landed = false;
  s.cooldown_until = absl::InfinitePast();
  --num_intents_;
  ++counters_.num_blocks;
  counters_.num_bytes += s.length;
  ++counters_.put_blocks;
  counters_.put_bytes += s.length;
  LruPushFrontLocked(slot);
  ExpireLocked(now);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> BlockStore::LendIntents(std::span<const StoreKey> keys,
                                                             std::span<const uint64_t> tokens) {
  if (keys.size() != tokens.size()) return absl::InvalidArgumentError("LendIntents: one token per key");
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_.Now());
  std::vector<int32_t> slots;
  slots.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto it = index_.find(keys[i]);
    if (it == index_.end() || slots_[it->second].state != SlotState::kIntent ||
        slots_[it->second].token != tokens[i] || slots_[it->second].landed) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", keys[i].ToHex(), " has no open intent with that token to write in place"));
    }
    slots.push_back(it->second);
  }
  for (const int32_t slot : slots) slots_[slot].state = SlotState::kLent;
  return slots;
}

void BlockStore::ReturnLent(std::span<const int32_t> slots, LentOutcome outcome) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  for (const int32_t slot : slots) {
    if (slot < 0 || slot >= capacity_) continue;
    Slot& s = slots_[slot];
    if (s.state != SlotState::kLent) continue;
    if (outcome == LentOutcome::kFailed || now > s.deadline) {
      if (outcome != LentOutcome::kFailed) ++counters_.expired_intents;
      FreeSlotLocked(slot);
      --num_intents_;
      continue;
    }
    // Its deadline's entry may have been skipped while it was lent: queue it again
    // (a duplicate is skipped as stale).
    s.state = SlotState::kIntent;
    s.landed = outcome == LentOutcome::kLanded;
    PushDue(&intent_due_, Due{.at = s.deadline, .id = s.token, .slot = slot});
  }
  returned_.SignalAll();
}

absl::Status BlockStore::CommitInPlace(const StoreKey& key, uint64_t token, uint64_t checksum, absl::Duration wait) {
  int32_t slot = -1;
  int64_t length = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time give_up = absl::Now() + wait;
    for (;;) {
      ExpireLocked(clock_.Now());
      const auto it = index_.find(key);
      if (it == index_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("block ", key.ToHex(), " has no open intent (never reserved, expired, or its write failed)"));
      }
      slot = it->second;
      Slot& s = slots_[slot];
      if (s.state == SlotState::kCommitted) {
        if (s.checksum == checksum) return absl::OkStatus();
        return absl::AlreadyExistsError(absl::StrCat("block ", key.ToHex(), " is committed with other bytes"));
      }
      if (s.token != token) {
        return absl::FailedPreconditionError(absl::StrCat("block ", key.ToHex(), " is reserved by another intent"));
      }
      if (s.state == SlotState::kLent) {
        // Its write has not been returned yet (the data plane's completion races the
        // writer's commit): wait for ReturnLent, bounded.
        if (returned_.WaitWithDeadline(&mu_, give_up) && absl::Now() >= give_up) {
          return absl::FailedPreconditionError(absl::StrCat("block ", key.ToHex(), " is still being written"));
        }
        continue;
      }
      if (s.state != SlotState::kIntent || !s.landed) {
        return absl::FailedPreconditionError(
            absl::StrCat("block ", key.ToHex(), " was not written in place (or is being committed)"));
      }
      s.state = SlotState::kWriting;
      length = s.length;
      break;
    }
  }
  // NOTE: no lock: kWriting, and nothing writes a slot once it was returned.
  const uint64_t written = kv::Checksum({SlotData(slot), static_cast<size_t>(length)});
  absl::MutexLock lock(&mu_);
  return FinishWriteLocked(slot, key, written, checksum);
}

absl::StatusOr<BlockStore::PinnedBlock> BlockStore::BeginRead(const StoreKey& key) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_.Now());
  const auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != SlotState::kCommitted) {
    return absl::NotFoundError(absl::StrCat("block ", key.ToHex(), " is not in the store"));
  }
  Slot& s = slots_[it->second];
  ++s.readers;
  TouchLocked(it->second);
  ++counters_.get_blocks;
  counters_.get_bytes += s.length;
  return PinnedBlock{.slot = it->second, .length = s.length, .checksum = s.checksum};
}

void BlockStore::EndRead(int32_t slot) {
  absl::MutexLock lock(&mu_);
  if (slot >= 0 && slot < capacity_ && slots_[slot].readers > 0) --slots_[slot].readers;
}

absl::Status BlockStore::PutOfCommitted(const StoreKey& key, bool same_as_committed, std::span<const std::byte> data,
                                        uint64_t checksum) {
  // The bytes sent are checked too: a writer's claim to the committed checksum is not
  // taken on trust.
  if (kv::Checksum(data) != checksum) {
    absl::MutexLock lock(&mu_);
    ++counters_.checksum_failures;
    return absl::DataLossError(absl::StrCat("block ", key.ToHex(), ": checksum mismatch"));
  }
  if (same_as_committed) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat("block ", key.ToHex(), " is committed with other bytes; a committed block is immutable"));
}

absl::StatusOr<uint64_t> BlockStore::Read(const StoreKey& key,
                                          absl::FunctionRef<void(std::span<const std::byte>)> consume) {
  int32_t slot = -1;
  int64_t length = 0;
  uint64_t checksum = 0;
  {
    absl::MutexLock lock(&mu_);
    ExpireLocked(clock_.Now());
    const auto it = index_.find(key);
    if (it == index_.end() || slots_[it->second].state != SlotState::kCommitted) {
      return absl::NotFoundError(absl::StrCat("block ", key.ToHex(), " is not in the store"));
    }
    slot = it->second;
    Slot& s = slots_[slot];
    ++s.readers;
    TouchLocked(slot);
    length = s.length;
    checksum = s.checksum;
  }
  // NOTE: no lock: a committed slot never changes, and readers > 0 keeps it from eviction.
  consume({SlotData(slot), static_cast<size_t>(length)});
  absl::MutexLock lock(&mu_);
  --slots_[slot].readers;
  ++counters_.get_blocks;
  counters_.get_bytes += length;
  return checksum;
}

BlockStoreStats BlockStore::Stats() {
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_.Now());
  BlockStoreStats stats = counters_;
  stats.num_intents = num_intents_;
  stats.num_leases = static_cast<int64_t>(leases_.size());
  stats.num_leased_blocks = num_leased_blocks_;
  return stats;
}

void BlockStore::ExpireLocked(absl::Time now) {
  // Leases first: a block whose lease ended may be evicted by what follows.
  while (!lease_due_.empty() && lease_due_.front().at <= now) {
    const Due due = lease_due_.front();
    PopDue(&lease_due_);
    if (const auto it = leases_.find(due.id); it != leases_.end() && it->second.expires == due.at) {
      EndLeaseLocked(due.id, due.at);
    }
  }
  while (!intent_due_.empty() && intent_due_.front().at <= now) {
    const Due due = intent_due_.front();
    PopDue(&intent_due_);
    Slot& s = slots_[due.slot];
    // NOTE: a slot being written is left to its writer, who checks the deadline when
    // done; a stale entry (the intent committed or freed since) is skipped.
    if (s.state != SlotState::kIntent || s.token != due.id) continue;
    FreeSlotLocked(due.slot);
    --num_intents_;
    ++counters_.expired_intents;
  }
}

int32_t BlockStore::TakeSlotLocked() {
  if (!free_.empty()) {
    const int32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  // The least recently used committed block that no lease protects and nobody reads.
  for (int32_t slot = lru_tail_; slot >= 0; slot = slots_[slot].lru_prev) {
    Slot& s = slots_[slot];
    if (s.readers > 0) continue;
    LruRemoveLocked(slot);
    index_.erase(s.key);
    --counters_.num_blocks;
    counters_.num_bytes -= s.length;
    ++counters_.evictions;
    journal_.Removed(s.key);
    s = Slot();
    return slot;
  }
  return -1;
}

StoreEventsPage BlockStore::ReadEvents(const StoreEventsCursor& from, size_t max_events) {
  max_events = std::max<size_t>(max_events, 1);
  absl::MutexLock lock(&mu_);
  StoreEventsPage page{.epoch = epoch_, .next = {.epoch = epoch_, .after = from.after}};
  int64_t cursor = from.snapshot_cursor;
  if (from.epoch != epoch_ || !journal_.Covers(from.after)) {
    page.reset = true;
    cursor = 0;
    page.next.after = journal_.last_sequence();
  }
  if (!page.reset && cursor <= 0) {
    page.events = journal_.After(from.after, max_events);
    if (!page.events.empty()) page.next.after = page.events.back().sequence;
    return page;
  }
  int32_t slot = static_cast<int32_t>(std::min<int64_t>(cursor, capacity_));
  for (; slot < capacity_ && page.events.size() < max_events; ++slot) {
    if (slots_[slot].state == SlotState::kCommitted) page.events.push_back(StoreEvent{.key = slots_[slot].key});
  }
  // At least one slot was passed, so a snapshot that goes on has a cursor > 0.
  page.next.snapshot_cursor = slot < capacity_ ? slot : 0;
  return page;
}

void BlockStore::FreeSlotLocked(int32_t slot) {
  Slot& s = slots_[slot];
  if (s.in_lru) LruRemoveLocked(slot);
  index_.erase(s.key);
  s = Slot();
  free_.push_back(slot);
}

bool BlockStore::TryPinLocked(int32_t slot, absl::Time now, absl::Time lease_end) {
  Slot& s = slots_[slot];
  if (s.pin_count == 0) {
    if (now < s.cooldown_until) return false;
    s.pinned_since = now;
    s.window_cut = false;
    LruRemoveLocked(slot);
    ++num_leased_blocks_;
  } else if (lease_end > s.pinned_since + max_lease_) {
    s.window_cut = true;
    return false;
  }
  ++s.pin_count;
  return true;
}

void BlockStore::UnpinLocked(int32_t slot, absl::Time at) {
  Slot& s = slots_[slot];
  if (--s.pin_count > 0) return;
  --num_leased_blocks_;
  if (s.window_cut) {
    s.cooldown_until = at + lease_;
    s.window_cut = false;
  }
  LruPushFrontLocked(slot);
}

void BlockStore::EndLeaseLocked(uint64_t id, absl::Time at) {
  const auto it = leases_.find(id);
  for (const int32_t slot : it->second.slots) UnpinLocked(slot, at);
  leases_.erase(it);
}

void BlockStore::LruPushFrontLocked(int32_t slot) {
  Slot& s = slots_[slot];
  s.lru_prev = -1;
  s.lru_next = lru_head_;
  if (lru_head_ >= 0) slots_[lru_head_].lru_prev = slot;
  lru_head_ = slot;
  if (lru_tail_ < 0) lru_tail_ = slot;
  s.in_lru = true;
}

void BlockStore::LruRemoveLocked(int32_t slot) {
  Slot& s = slots_[slot];
  if (!s.in_lru) return;
  if (s.lru_prev >= 0) slots_[s.lru_prev].lru_next = s.lru_next;
  else lru_head_ = s.lru_next;
  if (s.lru_next >= 0) slots_[s.lru_next].lru_prev = s.lru_prev;
  else lru_tail_ = s.lru_prev;
  s.lru_prev = s.lru_next = -1;
  s.in_lru = false;
}

void BlockStore::TouchLocked(int32_t slot) {
  if (!slots_[slot].in_lru) return;  // leased: not in the list until its last lease ends
  LruRemoveLocked(slot);
  LruPushFrontLocked(slot);
}

}  // namespace kvmesh::kv_store
