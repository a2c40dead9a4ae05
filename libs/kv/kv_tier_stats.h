// KvTierStats: the counters one lower KV tier (host memory, disk, the kv-store) keeps, for metrics
// (kvmesh_kv_tier_*{tier=...}) and for the load-versus-recompute decision, which reads
// the measured bandwidths.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

namespace kvmesh::kv {

struct KvTierStats {
  int64_t queries = 0;             // lookups
  int64_t hits = 0;                // ... that found the block
  int64_t blocks_offloaded = 0;    // blocks written into this tier
  int64_t bytes_offloaded = 0;
  int64_t blocks_onboarded = 0;    // blocks read back out of this tier
  int64_t bytes_onboarded = 0;
  int64_t evictions = 0;           // blocks dropped to make room
  int64_t checksum_failures = 0;   // blocks whose bytes did not verify on the way up
  int64_t write_failures = 0;      // offloads refused or failed (full, queue full, I/O error)
  int64_t read_failures = 0;       // kv-store: loads that failed otherwise (store dead, hung, restarted, block gone)
  int64_t skipped_records = 0;     // disk: corrupt, truncated or foreign records skipped at start-up
  // A remote tier (the kv-store): restarts of its peers seen (a new epoch), after each of
  // which everything it was believed to hold was forgotten.
  int64_t peer_restarts = 0;
  int32_t in_flight = 0;           // copies or I/O in flight now
  int32_t reads_in_flight = 0;     // kv-store: the loads among them (queued or running)
  // Measured as the tier runs: bytes moved per busy second (kv/busy_bandwidth.h, with
  // kDefaultBandwidthHalfLifeSeconds of decay); 0 until measured. The one estimate:
  // the load-or-recompute decision reads these same fields.
  double read_bytes_per_second = 0;
  double write_bytes_per_second = 0;
};

}  // namespace kvmesh::kv
