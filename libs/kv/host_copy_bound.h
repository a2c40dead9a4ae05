// MeasureHostCopyBound: what a plain memcpy of whole KV blocks achieves between two host
// buffers that do not fit in the cache — the bound the host tier's measured offload and
// onboard bandwidths (kv/host_kv_tier.h, bytes per busy second) are compared with. One
// definition for every benchmark that quotes a ratio to it (`kvmesh bench multi-turn`,
// tests/bench/kv_tier_bench), as kv/disk_read_bound.h is for the disk tier.
//
// Why larger than the cache: a tier copies between a device pool and a host arena that
// are each far larger than the last-level cache, so every byte comes from and goes to
// DRAM. A bound measured on buffers that fit (256 blocks of 64 KiB were 2 x 16 MiB)
// measures the cache instead: 20 GB/s against 7 GB/s from DRAM on the 2-core EPYC VM.
//
// Thread-safety: a free function; it uses only its own buffers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvmesh::kv {

struct HostCopyBound {
  double bytes_per_second = 0;  // median pass
  int64_t buffer_bytes = 0;     // each of source and destination
  int64_t block_bytes = 0;      // one memcpy
  int32_t num_threads = 1;      // copying at once, each its contiguous share of the blocks
};

// memcpy of `block_bytes` blocks, in order, from one buffer to the other, `repeats`
// passes; buffers of max(256 MiB, 2 x the last-level cache) rounded down to whole
// blocks, both touched before timing (no page faults in the figure). Two caches' worth
// each (4 together) cannot stay cached from one pass to the next; 8x, as before, took
// 2 x 2.5 GiB on a VM that reports a 320 MiB L3 and measured within 4% (10.9 GB/s
// against 11.3-11.4 for 368,640-byte blocks, tests/bench/kv_tier_bench).
// `num_threads` > 1 splits each pass into that many contiguous shares copied at once (an
// OpenMP team), the bound of KvStorage's swaps on as many threads.
HostCopyBound MeasureHostCopyBound(int64_t block_bytes, int32_t repeats = 9, int32_t num_threads = 1);

// The same copy into destination memory that nothing has written since construction:
// made before a run, measured once after it. Why: a host tier evicts its least recently
// used slot, so an offload writes memory that has idled the longest, and on some
// virtual machines the first write to a page after it idled costs a hypervisor fault.
// On the 2-core EPYC VM, 128-block batches of KvStorage::SwapOut into slots written 90 s
// earlier ran at 2.6-3.2 GB/s (zero-filled or distinct pages alike), into fresh memory
// at 12-13 GB/s; a second write to the same slots ran at full speed again. Only the
// first pass after an idle spell measures it: each Measure restarts the clock.
//
// Thread-safety: not thread-safe.
class IdleHostCopyBound {
 public:
  // Allocates and writes both buffers (as MeasureHostCopyBound sizes them) now.
  explicit IdleHostCopyBound(int64_t block_bytes);
  // One pass on `num_threads` into the destination as it has aged (the source is
  // rewritten first: a tier-0 pool is touched every step).
  HostCopyBound Measure(int32_t num_threads = 1);
  // How long the destination had idled at the last Measure.
  double idle_seconds() const { return idle_seconds_; }

 private:
  const int64_t block_bytes_;
  const int64_t blocks_;
  std::unique_ptr<std::byte[]> src_;
  std::unique_ptr<std::byte[]> dst_;
  std::chrono::steady_clock::time_point written_;
  double idle_seconds_ = 0;
};

}  // namespace kvmesh::kv
