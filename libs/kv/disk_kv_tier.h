// DiskKvTier: tier 2 of the KV hierarchy — offloaded blocks in slab files on a local
// disk, written and read asynchronously with io_uring (O_DIRECT where the filesystem
// allows it), surviving a restart.
//
// A block here is the KV of one full block over every layer, layer-major (layer l's
// KvLayout::BlockBytes() at offset l * block_bytes): `record_payload_bytes` =
// num_layers * block_bytes, the same unit the host tier holds (kv/host_kv_tier.h).
// Blocks are keyed by their BlockHash, the canonical identity every tier shares.
//
// On disk: a few slab files under `directory` (at most 1 GiB each, preallocated with
// fallocate when the disk has the room), each an array of fixed-size records.
// A record is a 4 KiB header (magic, format version, model salt, block hash, parent
// hash, dtype, layer count, block bytes, payload checksum XXH3-64, a header checksum)
// followed by the payload padded to 4 KiB. Create() rebuilds the index from the
// headers: a record whose header does not verify, a record cut short by a truncated
// file or a record of another model (salt, layout) is skipped, logged and counted —
// never served. Payloads are verified when read (below), not at start-up, so a
// restart reads only the headers. A record is written as one linked io_uring chain:
// (1) when its slot held a record before, that header is zeroed; (2) the payload;
// (3) the header — each only after the previous one completed, so a process killed
// mid-write leaves either the old record intact or a slot whose header does not
// verify. Headers carry a write sequence number: a restart restores the LRU order of
// the writes (reads since are not persisted) and keeps the newest of two records of
// one hash.
//
// It is a KvConnector (kv/kv_connector.h): KvTiers drives it as it drives every tier
// below the host tier. Asynchronous: StartSave / StartLoad queue I/O and return at once; Poll() reaps what
// has completed without blocking. The engine thread calls Poll() every step: it never
// waits for the disk. A full disk (ENOSPC) or a full queue fails that one write
// (the block simply is not offloaded, or its caller retries: kv/kv_tiers.h) and never
// a request. Writes never take more than half the queue, so reads always have room. Reads verify the payload's
// checksum on completion; a mismatch is kDataLoss (the caller recomputes) and drops
// the record.
//
// Thread-safety: not thread-safe; owned by the engine thread. Internally one reaper
// thread waits on the completion queue and timestamps completions (so the bandwidth
// figures are the disk's, not the engine's poll rate); it touches nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_connector.h"
#include "kv/kv_tier_stats.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct DiskKvTierOptions {
  std::string directory;       // --kv-disk-cache-dir; created if missing
  int64_t capacity_bytes = 0;  // --kv-disk-cache-bytes; records beyond it are evicted LRU
  int64_t record_payload_bytes = 0;  // num_layers * block_bytes
  // Identity of the KV (model, adapter, dtype, layout): records of another salt are foreign.
  uint64_t salt = 0;
  int32_t num_layers = 0;
  int64_t block_bytes = 0;  // one block of one layer
  int32_t dtype = 0;        // DType as an integer, recorded in headers
  // I/O in flight at most. Writes may hold at most half of it (MaxWritesInFlight), so a
  // read always finds room: a prefix hit on disk must never be recomputed because
  // write-through traffic filled the queue. Deep because reads beyond it wait for the
  // engine's next Poll (a step, up to a second of prefill on a CPU worker): 256 reads
  // cover a 4k-token prefix of 16-token blocks in one submission.
  int32_t queue_depth = 512;
  bool use_direct_io = true;  // O_DIRECT when the filesystem allows; else buffered + fdatasync-free
  // Tokens per block, only for KvEvent::num_tokens (the disk never sees tokens).
  int32_t block_size_tokens = kDefaultBlockSizeTokens;
};

// The on-disk format, public for tests and tools that inspect a cache directory.
inline constexpr int64_t kDiskRecordAlignment = 4096;   // header size, payload padding, O_DIRECT unit
inline constexpr uint32_t kDiskRecordFormatVersion = 1;
// Bytes of one record on disk: a header plus the payload rounded up to 4 KiB.
int64_t DiskRecordBytes(int64_t record_payload_bytes);
// Writes in flight at most for a queue of `queue_depth`: half of it (at least 1).
inline int32_t MaxWritesInFlight(int32_t queue_depth) { return queue_depth > 1 ? queue_depth / 2 : 1; }
// Where a held record sits: its slab file and the record's byte offset in it (the
// header; the payload follows at offset + kDiskRecordAlignment).
struct DiskRecordLocation {
  std::string path;
  int64_t offset = 0;
};

class DiskKvTier : public KvConnector {
 public:
  // InvalidArgument naming the flag (--kv-disk-cache-dir, --kv-disk-cache-bytes) for a
  // directory that cannot be created or written, or a capacity below one record.
  static absl::StatusOr<std::unique_ptr<DiskKvTier>> Create(const DiskKvTierOptions& options);
  ~DiskKvTier() override;  // waits for the I/O in flight
  DiskKvTier(const DiskKvTier&) = delete;
  DiskKvTier& operator=(const DiskKvTier&) = delete;

  std::string_view name() const override { return "disk"; }
  Tier tier() const override { return Tier::kDisk; }

  // Whether a complete, verified record of `hash` is held (writes still in flight do
  // not count). Counts a query (and a hit) in stats().
  bool Lookup(const BlockHash& hash);
  // The leading held records of the range, by Lookup (a query counted for each hit and
  // the first miss). Never pending: the index is local.
  KvConnectorMatch Match(std::span<const BlockHash> hashes, size_t first, size_t limit) override;
  // As Lookup, without counting.
  bool Contains(const BlockHash& hash) const override;

  // Queues a write of `payload` (record_payload_bytes; the caller keeps it valid and
  // unchanged until the completion) under `hash`, whose payload checksum (XXH3-64 of
  // the bytes) is `checksum`. Evicts LRU records to stay within capacity. Returns the
  // ticket. AlreadyExists if the hash is held or being written; ResourceExhausted when
  // writes hold their share of the queue (CanStartSave); InvalidArgument for a payload
  // of the wrong size.
  absl::StatusOr<int64_t> StartSave(const BlockHash& hash, const BlockHash& parent_hash,
                                    std::span<const std::byte> payload, uint64_t checksum) override;

  // Queues a read of `hash` into `dst` (record_payload_bytes, valid until the
  // completion). The record is pinned (never evicted) until its read completes.
  // NotFound if not held; ResourceExhausted when the queue is full.
  absl::StatusOr<int64_t> StartLoad(const BlockHash& hash, std::span<std::byte> dst) override;

  // Whether StartSave / StartLoad would find room in the queue now (callers with a
  // backlog submit it as room frees, kv/kv_tiers.h).
  bool CanStartSave() const override;
  bool CanStartLoad() const override;

  // Reaps completed I/O without blocking. A read's completion is stamped by the reaper
  // thread (so the bandwidth figures are the disk's, not the engine's poll rate).
  std::vector<KvIoCompletion> Poll() override;
  // Waits until nothing is in flight and returns every completion (shutdown, tests).
  std::vector<KvIoCompletion> Drain() override;

  // kStored when a write completes (and, after Create, one per record recovered from
  // disk, so a restarted worker re-announces what it holds); kRemoved when a record is
  // evicted or dropped; tier kDisk.
  std::vector<KvEvent> DrainEvents() override;

  int64_t num_records() const;
  int64_t capacity_records() const;
  int32_t num_in_flight() const override;
  const KvTierStats& stats() const override;
  // Index, LRU and slot accounting agree. Internal on the first violation; for tests.
  absl::Status CheckInvariants() const override;
  // Where `hash`'s record sits, if held (tests corrupt records through it).
  std::optional<DiskRecordLocation> LocationOf(const BlockHash& hash) const;
  // Whether the slab files were opened with O_DIRECT (false: the filesystem refused it
  // or use_direct_io was off).
  bool direct_io() const;

 private:
  class Impl;
  explicit DiskKvTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::kv
