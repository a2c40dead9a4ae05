// The checksum every KV byte range carries below tier 0 and across a transfer: XXH3-64,
// through xxHash's runtime dispatch (AVX-512, AVX2 or SSE2, whichever the CPU has).
//
// Why the dispatch: Debian's libxxhash is built for baseline x86-64, so a plain
// XXH3_64bits call runs its SSE2/scalar code at 5.3 GB/s on a block of a few hundred KiB
// (2-core EPYC VM), slower than the copy it guards; the dispatched one reads 48 GB/s
// from L2 and 28 GB/s from DRAM. The value is the same on every CPU: the dispatch picks
// an implementation, not an algorithm, so disk records written before it still verify.
//
// Thread-safety: stateless functions; a ChecksumStream belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t by value: no allocation per stream
#include <xxhash.h>

namespace kvmesh::kv {

// XXH3-64 of `bytes` (seed 0).
uint64_t Checksum(std::span<const std::byte> bytes);

// XXH3-64 of the concatenation of every Update's bytes: equal to Checksum() of them in
// one range. A copy that moves a block as several slices hashes each slice while it is
// in the cache, instead of rereading the whole block from DRAM afterwards.
class ChecksumStream {
 public:
  ChecksumStream();
  void Update(std::span<const std::byte> bytes);
  void Update(const std::byte* data, size_t size) { Update({data, size}); }
  uint64_t Digest() const;

 private:
  XXH3_state_t state_;
};

}  // namespace kvmesh::kv
