// A STREAM-style copy benchmark: the roofline denominator for decode, which
// streams every weight once per token.
#pragma once

namespace kvmesh::backend {

// Copies a buffer much larger than the last-level cache (each of the two buffers
// is max(1 GiB, 2 x LLC), so together >= 4 x LLC) with `num_threads` OpenMP
// threads (<= 0: one per core), counting bytes read + bytes written as STREAM's
// "copy" does. Returns the median of several timed runs (after one warm-up
// that also faults the pages in). Takes a few seconds and ~2 GiB of memory;
// returns 0 if the memory cannot be allocated.
double MeasureCopyBandwidthBytesPerSecond(int num_threads);

}  // namespace kvmesh::backend
