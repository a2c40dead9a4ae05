// STREAM-style memory benchmarks: the roofline denominators for decode, which streams
// every weight and every attended K/V byte once per token.
//
// Both run over buffers much larger than the last-level cache (each max(1 GiB, 2 x
// LLC)) in huge pages (core/huge_pages.h), as the engine's weights and KV pools are:
// over 4 KiB pages the same machine measures ~20% less, which would flatter every
// ratio against it. Each returns the median of several timed runs after one warm-up
// that also faults the pages in; a few seconds; 0 if the memory cannot be allocated.
#pragma once

namespace kvmesh::backend {

// Copies one buffer into another with `num_threads` OpenMP threads (<= 0: one per
// core), counting bytes read + bytes written as STREAM's "copy" does.
double MeasureCopyBandwidthBytesPerSecond(int num_threads);

// Reads one buffer (a sum, as a weight or KV stream reads), counting bytes read: the
// bound of an op that only streams its input.
double MeasureReadBandwidthBytesPerSecond(int num_threads);

}  // namespace kvmesh::backend
