// StreamingCopy: a copy between KV pools in host memory (a block going to or coming
// from the host tier) that writes around the caches.
//
// Why not memcpy: glibc's memcpy switches to non-temporal stores only above a fraction
// of the last-level cache, so the copies a tier makes (one block's layer, 4-64 KiB, to a
// scattered address) go through the cache: every destination line is first read for
// ownership (a third more DRAM traffic) and evicts a line of the KV that attention
// reads next. And a gather of scattered few-KiB layer slices is bound by latency: each
// slice is over before the hardware prefetcher locks on, so the next slice is
// prefetched while one is copied. Figures: tests/bench/kv_tier_bench ("host").
//
// Thread-safety: the functions keep no state; concurrent copies of disjoint ranges are
// safe.
#pragma once

#include <cstddef>

namespace kvmesh::kv {

// Copies `bytes` from `src` to `dst` (the ranges must not overlap). Non-temporal
// stores when both are 16-byte aligned and `bytes` is a multiple of 64 (every KV block
// is), a plain memcpy otherwise. `prefetch_next`, when not null, is the source of the
// next copy, at least `bytes` long: it is brought into L2 while this one runs, so a
// list of scattered copies runs as a pipeline. The stores are weakly
// ordered until StreamingCopyFence().
void StreamingCopy(std::byte* dst, const std::byte* src, size_t bytes, const std::byte* prefetch_next = nullptr);

// Orders every StreamingCopy before it ahead of any later store or release (sfence):
// call once after a batch of copies, before the bytes are handed to anyone else.
void StreamingCopyFence();

}  // namespace kvmesh::kv
