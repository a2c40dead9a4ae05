// KvConnector: the one interface of a source and sink of whole KV blocks below the host
// tier (ARCHITECTURE.md §3, "One interface for moving KV"): the disk tier
// (kv/disk_kv_tier.h) implements it, and so does every tier below it. KvTiers
// (kv/kv_tiers.h) drives all of them the same way, so load-or-recompute, load holds,
// queue backlogs and write-through are written once, there:
//
//   1. Match(hashes, first, limit)   how many leading blocks it can supply, as far as it
//                                    knows now: side-effect free on the blocks (a
//                                    connector may count the query), never blocks; a
//                                    connector that must ask a remote party answers
//                                    `pending` and starts finding out (ask again later).
//   2. StartLoad(hash, dst)          reads one block into a host slot that KvTiers
//                                    reserved (the engine onboards it from there).
//   3. StartSave(hash, ..., payload) writes one block the host tier holds (write-through
//                                    of what tier 0 offloaded); a connector may decline.
//   4. Poll()                        completions, once per engine step, one per block and
//                                    each with its own status: a load that failed is
//                                    recomputed, never served.
//
// Who frees what: a load's destination is a host slot KvTiers reserved; it stays
// reserved until the load's completion, whatever its status, so a connector writes into
// it only between StartLoad and the completion Poll returns. A save's payload stays
// valid and unchanged until its completion. Every ticket a Start* call returns ends in
// exactly one completion (Drain waits for all of them).
//
// Shape: vLLM's KVConnectorBase_V1 (scheduler side: get_num_new_matched_tokens,
// possibly "not yet known"; worker side: start_load_kv / save_kv_layer /
// get_finished with per-block load errors) and SGLang's BaseKVConnector, whose doc
// warns that completions nobody polls leak memory: here KvTiers polls every step.
//
// Thread-safety: implementations are not thread-safe; owned by the engine thread
// (through KvTiers). An implementation may run threads of its own behind Poll.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_tier_stats.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

// One finished load or save, as Poll returns it.
struct KvIoCompletion {
  enum class Kind : uint8_t { kWrite, kRead };
  int64_t ticket = 0;
  Kind kind = Kind::kWrite;
  BlockHash hash;
  // OK; kDataLoss (read: checksum mismatch, the block is dropped); kResourceExhausted
  // (write: no room); kUnavailable / kDeadlineExceeded (a remote connector's peer is
  // gone or slow); kInternal for other I/O errors. A failed read is recomputed.
  absl::Status status;
  int64_t bytes = 0;  // payload bytes moved (0 on failure)
  // A read that verified: the payload's checksum (kv::Checksum), which the host tier
  // records for the block instead of hashing the bytes a second time.
  uint64_t checksum = 0;
  // When the I/O completed, as the connector saw it (not when Poll reaped it, which is
  // up to an engine step later): load times measured from it are the connector's.
  std::chrono::steady_clock::time_point completed_at;
};

// What Match knows.
struct KvConnectorMatch {
  // Leading blocks of the asked range that the connector holds and can load now.
  int32_t num_blocks = 0;
  // The connector is still finding out whether it holds the blocks after those (a
  // remote lookup in flight): the caller may wait a step and ask again. A connector
  // keeps this bounded (its lookup's deadline): pending always ends.
  bool pending = false;
};

// A 128-bit key-space name (kv_store/store_key.h: StoreKeySpace's scope digest).
struct SharedKeySpace {
  uint64_t low = 0;
  uint64_t high = 0;

  bool operator==(const SharedKeySpace&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const SharedKeySpace& space) {
    return H::combine(std::move(h), space.low, space.high);
  }
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // "disk", "kv-store": for logs and errors.
  virtual std::string_view name() const = 0;
  // The tier its blocks count as in KV events and metrics.
  virtual Tier tier() const = 0;
  // For a connector whose blocks other workers share (the cluster kv-store): the name
  // of the key space it files this worker's blocks under, which the worker registers
  // with the scheduler so that the scheduler can tell from the store's own events
  // which of a prompt's blocks the store holds for it. Local tiers: none.
  virtual std::optional<SharedKeySpace> shared_key_space() const { return std::nullopt; }

  // How many of hashes[first, limit), from `first` on, this connector holds (module
  // `pending`, above). hashes[i]'s parent is hashes[i - 1] (kRootBlockHash for i = 0).
  virtual KvConnectorMatch Match(std::span<const BlockHash> hashes, size_t first, size_t limit) = 0;
  // Whether it holds `hash` now, as far as it knows (no query counted).
  virtual bool Contains(const BlockHash& hash) const = 0;

  // Whether StartLoad / StartSave would find room now: what does not waits in KvTiers'
  // backlog and is submitted as room frees (loads first).
  virtual bool CanStartLoad() const = 0;
  virtual bool CanStartSave() const = 0;
  // Starts reading `hash` into `dst` (one host slot's bytes). Returns the ticket.
  // NotFound if not held (any more); ResourceExhausted without room.
  virtual absl::StatusOr<int64_t> StartLoad(const BlockHash& hash, std::span<std::byte> dst) = 0;
  // Starts writing `payload`, whose kv::Checksum is `checksum`, under `hash`. Returns
  // the ticket. AlreadyExists if held or being written; ResourceExhausted without room
  // (or when the connector declines the block); InvalidArgument for a wrong size.
  virtual absl::StatusOr<int64_t> StartSave(const BlockHash& hash, const BlockHash& parent_hash,
                                            std::span<const std::byte> payload, uint64_t checksum) = 0;

  // Completions since the last call, without blocking.
  virtual std::vector<KvIoCompletion> Poll() = 0;
  // Waits until nothing is in flight and returns every completion (shutdown, tests).
  virtual std::vector<KvIoCompletion> Drain() = 0;
  virtual int32_t num_in_flight() const = 0;

  // How many of its asynchronous lookups have been answered (held or not) since it
  // started: a Match that said `pending` can say otherwise only once this moved, so a
  // waiting request is looked up again only then. 0 for a connector never pending.
  virtual uint64_t num_lookups_answered() const { return 0; }

  // kStored / kRemoved events of its tier since the last drain.
  virtual std::vector<KvEvent> DrainEvents() = 0;
  // Its counters; read_bytes_per_second is the load bandwidth that load-or-recompute
  // weighs (0 until measured).
  virtual const KvTierStats& stats() const = 0;
  // Its own bookkeeping agrees. Internal on the first violation; for tests.
  virtual absl::Status CheckInvariants() const = 0;
};

}  // namespace kvmesh::kv
