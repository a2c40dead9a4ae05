// HostKvTier: tier 1 of the KV hierarchy — offloaded blocks in host memory, keyed by
// their BlockHash (the canonical identity every tier shares).
//
// A slot holds one offloaded block: the KV of one full block over every layer (and
// every TP rank), layer-major, exactly the bytes a KvBlockSwap moves
// (engine/model_runner.h). A slot is in exactly one state:
//   free      — holds nothing;
//   filling   — reserved by BeginStore for `hash`; its bytes are being written (a swap
//               out runs in the next model step); not findable;
//   resident  — CommitStore recorded the bytes' checksum: Find() returns it.
// A resident slot may be pinned (an onboard or a disk write reads it); pinned and
// filling slots are never evicted. BeginStore evicts the least recently used resident,
// unpinned slot when none is free, and fails (the block is simply not offloaded) when
// every slot is filling or pinned.
//
// Integrity: CommitStore records XXH3-64 of the bytes; Verify() recomputes it before a
// block goes back up. A mismatch drops the slot and is counted: the caller recomputes.
//
// Memory: one allocation of num_slots * slot_bytes, 2 MiB aligned with MADV_HUGEPAGE on
// a CPU worker; a CUDA worker passes its own (pinned, or managed for UVM) through
// `allocate` / `deallocate`.
//
// Thread-safety: not thread-safe; owned by the engine thread (through KvCacheManager).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/busy_bandwidth.h"
#include "kv/kv_tier_stats.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct HostKvTierOptions {
  int64_t capacity_bytes = 0;  // --kv-host-cache-bytes: rounded down to whole slots
  int64_t slot_bytes = 0;      // one block over every layer and rank
  // Optional: where the slots live (pinned or managed memory on a CUDA worker). Both or
  // neither. `allocate` returns nullptr on failure.
  std::function<std::byte*(int64_t bytes)> allocate;
  std::function<void(std::byte*)> deallocate;
  bool record_events = true;  // queue kStored / kRemoved (tier kHost) for DrainEvents
};

// Index of a slot: 0 <= value < num_slots.
struct HostSlot {
  int32_t value = -1;
  auto operator<=>(const HostSlot&) const = default;
};

class HostKvTier {
 public:
  // InvalidArgument naming --kv-host-cache-bytes when the capacity holds no slot or
  // slot_bytes is not positive; ResourceExhausted when the memory cannot be allocated.
  static absl::StatusOr<std::unique_ptr<HostKvTier>> Create(const HostKvTierOptions& options);
  ~HostKvTier();
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  // The resident slot holding `hash`, marked most recently used; counts a query (and a
  // hit) in stats().
  std::optional<HostSlot> Find(const BlockHash& hash);
  // The resident slot holding `hash`, without counting or touching the LRU.
  std::optional<HostSlot> Peek(const BlockHash& hash) const;
  // Whether `hash` is resident or filling, without counting or touching the LRU.
  bool Contains(const BlockHash& hash) const { return index_.contains(hash); }

  // Reserves a slot to receive `hash` (state filling). AlreadyExists if the hash is
  // resident or filling; ResourceExhausted if every slot is filling or pinned.
  absl::StatusOr<HostSlot> BeginStore(const BlockHash& hash, const BlockHash& parent_hash);
  // The bytes have landed: records their checksum and makes the slot resident.
  // `checksum`, when given, is kv::Checksum of the bytes, computed by whoever wrote them
  // while they were in its cache (a fused copy, a verified disk read); otherwise the
  // slot is read once more to compute it.
  void CommitStore(HostSlot slot, std::optional<uint64_t> checksum = std::nullopt);
  // The bytes never landed (the step failed): frees the slot.
  void AbortStore(HostSlot slot);

  // Pins / unpins a resident slot (pins nest).
  void Pin(HostSlot slot);
  void Unpin(HostSlot slot);

  // Checks a resident slot's bytes against the checksum recorded at CommitStore.
  // `checksum`, when given, is kv::Checksum of the bytes as a reader just saw them (a
  // swap-in that hashed what it copied); otherwise the slot is read to compute it.
  // DataLoss on a mismatch, counted in stats().checksum_failures; the slot is dropped
  // (kRemoved) unless it is pinned, in which case the last pin's holder sees the
  // mismatch too when it reads the slot.
  absl::Status Verify(HostSlot slot, std::optional<uint64_t> checksum = std::nullopt);

  std::span<std::byte> data(HostSlot slot) {
    return {memory_ + static_cast<size_t>(slot.value) * static_cast<size_t>(slot_bytes_),
            static_cast<size_t>(slot_bytes_)};
  }
  uint64_t checksum(HostSlot slot) const { return slots_[slot.value].checksum; }
  const BlockHash& hash(HostSlot slot) const { return slots_[slot.value].hash; }
  const BlockHash& parent_hash(HostSlot slot) const { return slots_[slot.value].parent_hash; }
  bool is_pinned(HostSlot slot) const { return slots_[slot.value].pins > 0; }

  // Records one measured copy into or out of this tier (the engine times the swaps;
  // a step's copies run one after another, so their seconds are busy time as they are).
  void RecordOffload(int64_t blocks, int64_t bytes, double seconds);
  void RecordOnboard(int64_t blocks, int64_t bytes, double seconds);

  std::vector<KvEvent> DrainEvents();
  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  int64_t slot_bytes() const { return slot_bytes_; }
  int32_t num_resident() const { return num_resident_; }
  int32_t num_filling() const { return num_filling_; }
  int32_t num_pinned() const;
  const KvTierStats& stats() const { return stats_; }

  // States, counts, index and LRU agree. Internal on the first violation; for tests.
  absl::Status CheckInvariants() const;

 private:
  enum class State : uint8_t { kFree, kFilling, kResident };
  struct Slot {
    State state = State::kFree;
    int32_t pins = 0;
    BlockHash hash;
    BlockHash parent_hash;
    uint64_t checksum = 0;
    int32_t prev = -1;  // LRU links of resident slots (head = least recently used)
    int32_t next = -1;
  };

  HostKvTier(const HostKvTierOptions& options, std::byte* memory, int32_t num_slots);
  void LruUnlink(int32_t s);
  void LruPushBack(int32_t s);
  // Drops a resident slot: kRemoved, back to free.
  void Drop(int32_t s);
  void Event(KvEvent::Kind kind, const Slot& slot);

  const HostKvTierOptions options_;
  const int64_t slot_bytes_;
  std::byte* const memory_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;  // stack of free slots
  int32_t lru_head_ = -1;
  int32_t lru_tail_ = -1;
  int32_t num_resident_ = 0;
  int32_t num_filling_ = 0;
  absl::flat_hash_map<BlockHash, int32_t> index_;  // resident and filling slots
  std::vector<KvEvent> events_;
  BusyBandwidth read_rate_{{.half_life_seconds = kDefaultBandwidthHalfLifeSeconds}};
  BusyBandwidth write_rate_{{.half_life_seconds = kDefaultBandwidthHalfLifeSeconds}};
  KvTierStats stats_;
};

}  // namespace kvmesh::kv
