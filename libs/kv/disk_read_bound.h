// MeasureDiskReadBound: how fast the disk under a directory reads, with O_DIRECT and
// io_uring at a given I/O size and queue depth — the bound the disk tier's measured
// read bandwidth (kv/disk_kv_tier.h, bytes per busy second) is compared with. One
// definition for every benchmark that quotes a ratio to it (`kvmesh bench multi-turn`,
// tests/bench/kv_tier_bench), so their ratios mean the same thing.
//
// The file (`file_bytes`, the size of the tier's data) is written with O_DIRECT and
// fsynced, so none of it is in the page cache; then it is read front to back,
// `io_bytes` per read with `queue_depth` reads in flight, `repeats` times; the best
// pass is returned (a bound; other work on a shared disk only slows a pass down). With io_bytes = the tier's record and queue_depth = the tier's,
// this is what the tier could read at most with its own I/O pattern (the tier also
// skips a 4 KiB header per record and reads records in LRU, not file, order). With
// 4 MiB at depth 1 it is `dd bs=4M iflag=direct`.
//
// Thread-safety: a free function; it uses only its own file and ring.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvmesh::kv {

struct DiskReadBoundOptions {
  std::string directory;    // the tier's filesystem; created if missing
  int64_t file_bytes = 0;   // rounded up to whole I/Os
  int64_t io_bytes = 0;     // per read; rounded up to 4 KiB (O_DIRECT)
  int32_t queue_depth = 1;  // reads in flight
  int32_t repeats = 5;
  // When set: read the first file_bytes of this existing file (a disk tier's slab file,
  // to compare the tier with its own data) instead of writing a fresh one; it is left
  // as it is. `directory` is then unused.
  std::string existing_file;
};

struct DiskReadBound {
  double bytes_per_second = 0;  // best pass
  int64_t file_bytes = 0;       // as read (rounded)
  int64_t io_bytes = 0;
  int32_t queue_depth = 0;
};

// InvalidArgument for non-positive sizes or depth; Unavailable when the directory's
// filesystem refuses O_DIRECT or an I/O fails (the message names the file).
absl::StatusOr<DiskReadBound> MeasureDiskReadBound(const DiskReadBoundOptions& options);

}  // namespace kvmesh::kv
