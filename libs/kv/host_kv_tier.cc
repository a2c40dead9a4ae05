#include "kv/host_kv_tier.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/huge_pages.h"
#include "kv/checksum.h"

namespace kvmesh::kv {
namespace {


// Backs every page now, as pinned memory is on a CUDA worker: a page first touched by an
// offload would cost that offload a page fault and a page clear inside the engine step.
void Prefault(std::byte* memory, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(memory, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  std::memset(memory, 0, bytes);  // kernels before 5.14
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostKvTier>> HostKvTier::Create(const HostKvTierOptions& options) {
  if (options.slot_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("host KV tier: block bytes must be positive, got ",
                                                   options.slot_bytes));
  }
  if (options.capacity_bytes < options.slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-host-cache-bytes ", options.capacity_bytes,
                                                   " holds no KV block: one block (every layer) takes ",
                                                   options.slot_bytes, " bytes"));
  }
  if (static_cast<bool>(options.allocate) != static_cast<bool>(options.deallocate)) {
    return absl::InvalidArgumentError("host KV tier: give both allocate and deallocate, or neither");
  }
  const int64_t num_slots64 = std::min<int64_t>(options.capacity_bytes / options.slot_bytes, INT32_MAX);
  const int64_t bytes = num_slots64 * options.slot_bytes;
  std::byte* memory = nullptr;
  if (options.allocate) {
    memory = options.allocate(bytes);
  } else {
    // Huge pages cut TLB misses on the large copies.
    memory = AllocateHugePageMemory(bytes).release();
    if (memory != nullptr) Prefault(memory, RoundUpToHugePages(bytes));
  }
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host KV tier: cannot allocate ", bytes, " bytes for --kv-host-cache-bytes"));
  }
  return std::unique_ptr<HostKvTier>(new HostKvTier(options, memory, static_cast<int32_t>(num_slots64)));
}

HostKvTier::HostKvTier(const HostKvTierOptions& options, std::byte* memory, int32_t num_slots)
    : options_(options), slot_bytes_(options.slot_bytes), memory_(memory), slots_(num_slots) {
  free_.reserve(num_slots);
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

HostKvTier::~HostKvTier() {
  if (options_.deallocate) {
    options_.deallocate(memory_);
  } else {
    std::free(memory_);
  }
}

void HostKvTier::LruUnlink(int32_t s) {
  Slot& m = slots_[s];
  if (m.prev >= 0) slots_[m.prev].next = m.next; else lru_head_ = m.next;
  if (m.next >= 0) slots_[m.next].prev = m.prev; else lru_tail_ = m.prev;
  m.prev = m.next = -1;
}

void HostKvTier::LruPushBack(int32_t s) {
  Slot& m = slots_[s];
  m.prev = lru_tail_;
  m.next = -1;
  if (lru_tail_ >= 0) slots_[lru_tail_].next = s; else lru_head_ = s;
  lru_tail_ = s;
}

void HostKvTier::Event(KvEvent::Kind kind, const Slot& slot) {
  if (!options_.record_events) return;
  events_.push_back(KvEvent{.kind = kind, .block_hash = slot.hash, .parent_hash = slot.parent_hash,
                            .tier = Tier::kHost, .num_tokens = 0});
}

std::optional<HostSlot> HostKvTier::Find(const BlockHash& hash) {
  ++stats_.queries;
  const auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != State::kResident) return std::nullopt;
  ++stats_.hits;
  LruUnlink(it->second);
  LruPushBack(it->second);
  return HostSlot{it->second};
}

std::optional<HostSlot> HostKvTier::Peek(const BlockHash& hash) const {
  const auto it = index_.find(hash);
  if (it == index_.end() || slots_[it->second].state != State::kResident) return std::nullopt;
  return HostSlot{it->second};
}

absl::StatusOr<HostSlot> HostKvTier::BeginStore(const BlockHash& hash, const BlockHash& parent_hash) {
  if (index_.contains(hash)) return absl::AlreadyExistsError("host KV tier already holds this block");
  int32_t s = -1;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    for (int32_t c = lru_head_; c >= 0; c = slots_[c].next) {
      if (slots_[c].pins == 0) {
        s = c;
        break;
      }
    }
    if (s < 0) {
      ++stats_.write_failures;
      return absl::ResourceExhaustedError("host KV tier: every slot is being filled or read");
    }
    Drop(s);
    ++stats_.evictions;
    free_.pop_back();  // Drop pushed it
  }
  Slot& m = slots_[s];
  m.state = State::kFilling;
  m.hash = hash;
  m.parent_hash = parent_hash;
  m.checksum = 0;
  ++num_filling_;
  ++stats_.in_flight;
  index_[hash] = s;
  return HostSlot{s};
}

void HostKvTier::CommitStore(HostSlot slot, std::optional<uint64_t> checksum) {
  Slot& m = slots_[slot.value];
  if (m.state != State::kFilling) return;
  m.checksum = checksum.has_value() ? *checksum : Checksum(data(slot));
  m.state = State::kResident;
  --num_filling_;
  --stats_.in_flight;
  ++num_resident_;
  LruPushBack(slot.value);
  Event(KvEvent::Kind::kStored, m);
}

void HostKvTier::AbortStore(HostSlot slot) {
  Slot& m = slots_[slot.value];
  if (m.state != State::kFilling) return;
  index_.erase(m.hash);
  m = Slot{};
  --num_filling_;
  --stats_.in_flight;
  ++stats_.write_failures;
  free_.push_back(slot.value);
}

void HostKvTier::Drop(int32_t s) {
  Slot& m = slots_[s];
  Event(KvEvent::Kind::kRemoved, m);
  LruUnlink(s);
  index_.erase(m.hash);
  m = Slot{};
  --num_resident_;
  free_.push_back(s);
}

void HostKvTier::Pin(HostSlot slot) { ++slots_[slot.value].pins; }
void HostKvTier::Unpin(HostSlot slot) {
  if (slots_[slot.value].pins > 0) --slots_[slot.value].pins;
}

absl::Status HostKvTier::Verify(HostSlot slot, std::optional<uint64_t> checksum) {
  Slot& m = slots_[slot.value];
  if (m.state != State::kResident) return absl::FailedPreconditionError("host KV tier: slot is not resident");
  if ((checksum.has_value() ? *checksum : Checksum(data(slot))) == m.checksum) return absl::OkStatus();
  ++stats_.checksum_failures;
  const std::string hex = m.hash.ToHex();
  if (m.pins == 0) Drop(slot.value);
  return absl::DataLossError(absl::StrCat("host KV tier: block ", hex, " failed its checksum"));
}

void HostKvTier::RecordOffload(int64_t blocks, int64_t bytes, double seconds) {
  stats_.blocks_offloaded += blocks;
  stats_.bytes_offloaded += bytes;
  write_rate_.Add(bytes, seconds);
  stats_.write_bytes_per_second = write_rate_.units_per_second();
}

void HostKvTier::RecordOnboard(int64_t blocks, int64_t bytes, double seconds) {
  stats_.blocks_onboarded += blocks;
  stats_.bytes_onboarded += bytes;
  read_rate_.Add(bytes, seconds);
  stats_.read_bytes_per_second = read_rate_.units_per_second();
}

std::vector<KvEvent> HostKvTier::DrainEvents() { return std::exchange(events_, {}); }

int32_t HostKvTier::num_pinned() const {
  int32_t n = 0;
  for (const Slot& s : slots_) n += s.pins > 0 ? 1 : 0;
  return n;
}

absl::Status HostKvTier::CheckInvariants() const {
  int32_t resident = 0, filling = 0, free_count = 0;
  for (int32_t s = 0; s < num_slots(); ++s) {
    const Slot& m = slots_[s];
    switch (m.state) {
      case State::kFree:
        ++free_count;
        if (m.pins != 0) return absl::InternalError(absl::StrCat("host tier: free slot ", s, " is pinned"));
        break;
      case State::kFilling:
        ++filling;
        break;
      case State::kResident:
        ++resident;
        break;
    }
    if (m.state != State::kFree) {
      const auto it = index_.find(m.hash);
      if (it == index_.end() || it->second != s) {
        return absl::InternalError(absl::StrCat("host tier: slot ", s, " is not indexed by its hash"));
      }
    }
  }
  int32_t lru = 0;
  for (int32_t c = lru_head_; c >= 0; c = slots_[c].next) {
    if (slots_[c].state != State::kResident) return absl::InternalError("host tier: LRU holds a non-resident slot");
    if (++lru > num_slots()) return absl::InternalError("host tier: LRU cycle");
  }
  if (resident != num_resident_ || filling != num_filling_ || lru != resident ||
      free_count != static_cast<int32_t>(free_.size()) ||
      static_cast<int32_t>(index_.size()) != resident + filling) {
    return absl::InternalError(absl::StrCat("host tier: counts disagree (resident ", resident, "/", num_resident_,
                                            ", filling ", filling, "/", num_filling_, ", lru ", lru, ", free ",
                                            free_count, "/", free_.size(), ", index ", index_.size(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
