// KvTiers: the lower tiers under one device pool — the host tier (kv/host_kv_tier.h)
// and, below it, any number of KvConnectors (kv/kv_connector.h: the disk tier, the
// cluster kv-store), in the order they are asked — and every copy between them and
// tier 0. KvCacheManager owns it and calls it at four points:
//
//   1. Offload, by write-back on eviction: when tier 0 hands a cached block to someone
//      else (BlockPool's eviction listener), OnDeviceEvict reserves a host slot for it
//      and queues a swap-out. The next model step copies the block out BEFORE anything
//      writes into it (ModelBatch's order). The host tier saves every block it
//      receives through to each connector (asynchronously; a connector may decline),
//      so host evictions are drops.
//   2. Lookup: ExtendPrefix continues a prefix past tier 0 into the host tier (each hit
//      pinned) and counts the blocks after that which the connectors hold (each block
//      from the first connector that holds it). A hit's bytes are verified against
//      their checksum by the copy that brings them up, when the runner can hash what it
//      copies (set_swap_ins_verified_by_copy; FinishSwaps drops a block that failed),
//      else here, in a pass of its own before the copy. A connector still finding out
//      (a remote lookup in flight) makes the lookup report `pending`.
//   3. Onboard: a host hit becomes a fresh tier-0 block with a queued swap-in; a
//      connector's block is first loaded into a host slot (StartLoads, asynchronous),
//      after which the request finds it as a host hit. While it loads the request holds
//      no tier-0 block, so a load can never deadlock the scheduler. It holds host slots
//      instead: the load's owner (the waiting request) keeps every block it read, and
//      the host hits its lookup found before them, pinned until ReleaseLoadHold
//      (admission or its end). Without that hold the offloads of the running requests'
//      evictions evicted most loaded blocks from the host tier before the request was
//      admitted, and it recomputed them (the multi-turn benchmark lost 79% of its disk
//      loads). Holds are capped (load_hold_share of the host slots, together):
//      uncapped, the holds of a few waiting requests filled the host tier, so the
//      evictions of the running ones were not offloaded at all (lost for good: the host
//      tier is the only way down) and later loads were cut short (the benchmark skipped
//      1,912 offloads and recomputed 3,496 of 13,733 loaded blocks). A load that does
//      not fit in what the other owners leave waits (KvLoadStart::deferred) holding
//      nothing, until they are admitted; an owner that already holds is never deferred
//      (it loads what fits), and neither is a load when nobody else holds: so holds
//      always drain.
//   4. Each step: TakeSwaps before the model runs, FinishSwaps after it (checksums,
//      bandwidths, write-through), Poll for the connectors' completions. A load that
//      failed (its connector's peer died, a checksum mismatch) frees its host slot and
//      the block is recomputed: never served.
//
// Connector queues: each connector keeps at most its own queue of I/O in flight
// (CanStartLoad / CanStartSave). What does not fit waits in that connector's backlog,
// which Poll submits as room frees, loads first: a hit is never recomputed because the
// queue was busy (it waits, like any load), and a write-through is never dropped because
// a burst of evictions outran the queue (up to kMaxWriteBacklog of host slots; beyond
// that it is skipped and counted, the host copy still serves).
//
// Pins: a pinned host slot is never evicted. Every pin is held by exactly one of: a
// lookup not yet used or released (ExtendPrefix -> AllocateSlots or Release), a queued
// or running swap-in, a connector save in flight or waiting in a backlog, a load hold
// (StartLoads -> ReleaseLoadHold). CheckInvariants counts them.
//
// Load or recompute: lower-tier hits are loaded only when their bytes at each tier's
// measured read bandwidth arrive sooner than recomputing their tokens at the engine's
// measured prefill speed (set_prefill_tokens_per_second); before both are measured
// they are loaded, and a connector hit is loaded every 16th time recomputing wins, to
// measure again. The bandwidths are the tiers' own stats (read_bytes_per_second: bytes
// per busy second, kv/busy_bandwidth.h), the same figures the metrics and benchmarks
// print.
//
// Thread-safety: not thread-safe; owned by the engine thread (through KvCacheManager).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "kv/disk_kv_tier.h"
#include "kv/kv_connector.h"
#include "kv/host_kv_tier.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

// One queued copy between a tier-0 block and a host slot.
struct KvSwap {
  BlockId block;
  HostSlot slot;
  std::byte* host = nullptr;  // the slot's bytes
  uint64_t checksum = 0;      // a swap-in's: what the slot's bytes must hash to
};

// The copies the next model step must run, in ModelBatch's order (out, then in).
struct KvSwaps {
  std::vector<KvSwap> out;
  std::vector<KvSwap> in;
  bool empty() const { return out.empty() && in.empty(); }
};

// Counters beyond each tier's own KvTierStats.
struct KvTiersStats {
  int64_t offload_skipped = 0;     // evictions not offloaded (host full of pinned / filling slots)
  // What pinned the host tier when offloads were skipped, summed over the skips (divide
  // by offload_skipped for the mean): slots of load holds, slots waiting for or in a
  // disk write (write-through backlog and writes in flight), ...
  int64_t offload_skipped_held_slots = 0;
  int64_t offload_skipped_write_slots = 0;
  int64_t offload_skipped_copy_slots = 0;  // ... and by this step's copies: filling, swap-ins, lookups
  int64_t loads_started = 0;       // connector blocks read into the host tier
  int64_t load_decisions = 0;      // lower-tier hits loaded ...
  int64_t recompute_decisions = 0; // ... or recomputed because loading would be slower
  int64_t reads_queued = 0;        // connector loads that waited in the backlog for queue room
  int64_t writes_queued = 0;       // write-throughs that waited in the backlog for queue room
  int64_t writes_skipped = 0;      // write-throughs dropped: the backlog was full
  int64_t reads_lost = 0;          // queued reads whose record was gone when room came (recomputed)
  int64_t loads_deferred = 0;      // loads that waited: other owners' holds left too little room
  int64_t load_blocks_cut = 0;     // connector blocks a load did not cover (no room in the share / host tier)
  int64_t lookups_pending = 0;     // lookups a connector could not answer yet (a remote lookup in flight)
};

// What StartLoads did.
struct KvLoadStart {
  // Blocks of the asked range, from its first on, that will be in the host tier for the
  // owner: reads started or queued, blocks resident already (now held), or blocks being
  // read for another owner. The owner waits for these; what follows them is recomputed.
  int32_t num_blocks = 0;
  // Nothing was started or held: other owners' holds leave too little of the share.
  // The owner waits holding nothing and tries again once they are admitted.
  bool deferred = false;
};

// What ExtendPrefix found below the host tier.
struct KvConnectorHits {
  // Blocks after the host hits that the connectors hold and that are worth loading
  // (StartLoads).
  int32_t num_blocks = 0;
  // A connector is still finding out about the blocks after those (KvConnectorMatch).
  bool pending = false;
};

class KvTiers {
 public:
  // `host` is required; `connectors` (disk, kv-store, ...) are asked in this order and
  // may be empty. block_size_tokens: tokens per block. Without `record_events` the
  // tiers' events are dropped as they come (nobody drains).
  KvTiers(std::unique_ptr<HostKvTier> host, std::vector<std::unique_ptr<KvConnector>> connectors,
          int32_t block_size_tokens, bool record_events = true);
  // One connector (or none: null).
  KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<KvConnector> connector, int32_t block_size_tokens,
          bool record_events = true);
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  // Tier 0 is about to reuse `block`, which held `hash`: queue its offload.
  void OnDeviceEvict(BlockId block, const BlockHash& hash, const BlockHash& parent_hash);
  // Tier 0 has just registered the full block `block` as holding `hash`. Under
  // write-through (set_write_through) its offload is queued now, so a later eviction
  // finds it in the host tier and copies nothing; under write-back (the default) this
  // does nothing. The measured choice between them is in docs/architecture.md §3.
  void OnDeviceCache(BlockId block, const BlockHash& hash, const BlockHash& parent_hash);
  void set_write_through(bool on) { write_through_ = on; }
  bool write_through() const { return write_through_; }

  // Continues a prefix whose first `first` blocks tier 0 holds: appends the host hits of
  // hashes[first..limit) to `host_slots` (verified and pinned; stops at the first miss,
  // checksum failure or a hit that recomputing beats) and returns how many blocks after
  // those the connectors hold (worth loading: see the file comment).
  KvConnectorHits ExtendPrefix(std::span<const BlockHash> hashes, size_t first, size_t limit,
                               std::vector<HostSlot>* host_slots);
  // Drops a lookup's pins (the prefix was not used).
  void Release(std::span<const HostSlot> host_slots);
  // The lookup's host hit `slot` now fills tier-0 `block`: the pin passes to the swap-in.
  void QueueSwapIn(BlockId block, HostSlot slot);

  // The copies for the next step; the queue empties. Run them, then FinishSwaps.
  KvSwaps TakeSwaps();
  // The step that carried `swaps` ran (`copied`: the runner executed them) in the given
  // seconds each way. `out_checksums`: one per swaps.out when the copy hashed the bytes
  // it wrote (ModelOutput::swap_out_checksums), else empty (the host tier hashes them).
  // `in_checksums`: one per swaps.in when the copy hashed the bytes it read
  // (ModelOutput::swap_in_checksums); each is checked against its slot's record, and a
  // slot that differs is dropped and counted (HostKvTier::Verify). Returns how many
  // differed: the tier-0 blocks they filled hold no valid KV.
  int32_t FinishSwaps(const KvSwaps& swaps, bool copied, double out_seconds, double in_seconds,
                      std::span<const uint64_t> out_checksums = {}, std::span<const uint64_t> in_checksums = {});
  // Whether the runner hashes every swap-in as it copies it (ModelRunner::
  // verifies_swap_ins): lookups then leave the verification to that copy, which reads
  // the slot once instead of twice.
  void set_swap_ins_verified_by_copy(bool on) { swap_ins_verified_by_copy_ = on; }
  bool has_pending_swaps() const { return !pending_.empty(); }

  // For `owner`: loads hashes[first, first + n), each from the first connector that
  // holds it, into host slots (parents from the chain) and holds `host_hits` (a
  // lookup's host hits just before them; the lookup keeps its own pins). Loads that find
  // no queue room wait in their connector's backlog (their host slots are reserved now
  // either way). Every block read and
  // every hit stays pinned for `owner` until ReleaseLoadHold(owner); a second load adds
  // to the hold. Holds together stay within max_held_slots() (file comment):
  //   1. the whole load fits in the room left: all of it is loaded;
  //   2. it does not, `owner` holds nothing yet and another owner holds: deferred,
  //      nothing happens (the caller retries when holds are released);
  //   3. otherwise the hits and then as many reads as fit (none if the hits alone do
  //      not fit: then nothing is held) — the rest is recomputed, counted in
  //      stats().load_blocks_cut. A host tier without a free or unpinned slot, or a
  //      block no connector holds any more, also cuts the load there.
  KvLoadStart StartLoads(RequestId owner, std::span<const BlockHash> hashes, size_t first, size_t n,
                         std::span<const HostSlot> host_hits = {});
  // Unpins what `owner`'s loads hold (reads still in flight commit unheld). Call it when
  // the owner is admitted (its lookup pinned what it uses) or ends; a no-op without a hold.
  void ReleaseLoadHold(RequestId owner);
  // Owners with a load hold, and how many host slots each holds or has reserved for
  // reads still running (stranded-block checks).
  std::vector<std::pair<RequestId, int32_t>> load_holds() const;
  bool has_load_hold(RequestId owner) const { return holds_.contains(owner); }
  // Host slots all load holds take together (held or reserved for a read), and the most
  // they may: load_hold_share of the host tier's slots (at least 1).
  int32_t held_slots() const { return held_slots_; }
  int32_t max_held_slots() const;
  // The share of host slots load holds may take together; the rest stays for offloads
  // and lookups. NOTE: one half by default: a hold only saves a re-read or recompute of
  // a block already on disk, while an offload refused loses its block for good; one
  // half still holds more than one waiting request's prefix in the benchmark.
  void set_load_hold_share(double share) { load_hold_share_ = share; }
  // Whether any of `hashes` is still being loaded from a connector.
  bool AnyLoading(std::span<const BlockHash> hashes) const;
  // The connectors' num_lookups_answered, summed.
  uint64_t lookups_answered() const;
  bool has_loads_in_flight() const { return !loading_.empty(); }
  // Reaps the connectors' completions (non-blocking) and submits the backlogs into the
  // room they freed (loads first).
  void Poll();
  // Waits for every connector I/O in flight (shutdown, tests).
  void DrainConnectors();
  void set_prefill_tokens_per_second(double tps) { prefill_tokens_per_second_ = tps; }
  double prefill_tokens_per_second() const { return prefill_tokens_per_second_; }

  // Events of every lower tier since the last drain.
  std::vector<KvEvent> DrainEvents();

  HostKvTier& host() { return *host_; }
  const HostKvTier& host() const { return *host_; }
  // The connectors, in the order they are asked.
  int32_t num_connectors() const { return static_cast<int32_t>(lanes_.size()); }
  const KvConnector& connector(int32_t i) const { return *lanes_[static_cast<size_t>(i)].connector; }
  // The disk tier, if it is one of the connectors (null otherwise).
  DiskKvTier* disk();
  const DiskKvTier* disk() const;
  const KvTiersStats& stats() const { return stats_; }
  // Host pins held by lookups not yet used or released (0 between steps).
  int32_t num_lookup_pins() const { return lookup_pins_; }

  // The tiers' own invariants, plus: the host pins are exactly those of outstanding
  // lookups, queued swap-ins and disk writes in flight. Internal on the first violation.
  absl::Status CheckInvariants() const;

 private:
  struct Read {
    HostSlot slot;
    BlockHash hash;
    RequestId owner;      // whose hold the block joins when it lands ...
    int64_t hold_id = 0;  // ... if that hold is still this one (not released and retaken)
  };
  // One connector and its I/O: loads fill a reserved host slot; saves pin their slot.
  struct Lane {
    std::unique_ptr<KvConnector> connector;
    absl::flat_hash_map<int64_t, HostSlot> saves;  // in flight, by ticket
    absl::flat_hash_map<int64_t, Read> loads;      // in flight, by ticket
    // Loads and saves waiting for queue room, oldest first. A queued load holds its host
    // slot in the filling state; a queued save pins its resident slot.
    std::deque<Read> load_backlog;
    std::deque<HostSlot> save_backlog;
    bool busy() const { return !saves.empty() || !loads.empty() || !load_backlog.empty() || !save_backlog.empty(); }
  };

  // Whether loading blocks at the given seconds beats recomputing `num_blocks`.
  bool LoadBeatsRecompute(int64_t num_blocks, double load_seconds) const;
  // Seconds to read `num_blocks` host slots at `bytes_per_second` (0 when unmeasured).
  double LoadSeconds(int64_t num_blocks, double bytes_per_second) const;
  // The first connector that holds `hash` now, or null.
  Lane* LaneHolding(const BlockHash& hash);
  void StartWriteThrough(HostSlot slot);
  // Saves `slot` through `lane`, or queues the save for room.
  void StartSave(Lane& lane, HostSlot slot);
  // Submits `lane`'s backlogged loads, then saves, while it has room.
  void SubmitBacklog(Lane& lane);
  // Submits `read` into its reserved slot; false when the connector no longer holds it.
  bool SubmitLoad(Lane& lane, const Read& read);
  // Handles `lane`'s completions.
  void FinishIo(Lane& lane, std::span<const KvIoCompletion> completions);
  // A load finished (any status): commits or aborts its slot; a committed block joins
  // its owner's hold if that hold still exists.
  void FinishLoad(Lane& lane, const KvIoCompletion& completion);
  // A load of `read.owner`'s hold will not land (failed, or its record went): its
  // reservation is given back.
  void UnreserveRead(const Read& read);

  std::unique_ptr<HostKvTier> host_;
  std::vector<Lane> lanes_;
  const int32_t block_size_tokens_;
  const bool record_events_;
  KvSwaps pending_;
  static constexpr int32_t kMaxWriteBacklog = 4096;
  static constexpr int32_t kReprobeEvery = 16;
  int32_t connector_recompute_streak_ = 0;  // connector hits recomputed since the last load
  absl::flat_hash_set<BlockHash> loading_;
  // Load holds: the host slots pinned for each waiting owner (one pin per entry) and
  // the loads of it still running, each with a slot reserved in held_slots_.
  struct Hold {
    int64_t id = 0;
    std::vector<HostSlot> slots;
    int32_t reads_pending = 0;
  };
  absl::flat_hash_map<RequestId, Hold> holds_;
  int64_t next_hold_id_ = 1;
  int32_t held_slots_ = 0;  // sum over holds_ of slots + reads_pending
  double load_hold_share_ = 0.5;
  double prefill_tokens_per_second_ = 0;
  int32_t lookup_pins_ = 0;
  bool write_through_ = false;
  bool swap_ins_verified_by_copy_ = false;
  KvTiersStats stats_;
};

}  // namespace kvmesh::kv
