// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011),
// the counter-based generator of Random123 and of curand's curandStatePhilox4_32_10_t:
// 10 rounds over a 128-bit counter under a 64-bit key. Host and device, so tests can
// check it against Random123's known-answer vectors and reproduce a row's draw.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

__host__ __device__ __forceinline__ Philox4x32 Philox4x32x10(Philox4x32 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * ctr.v[0];
    const uint64_t p1 = uint64_t{kM1} * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// The uniform double in [0, 1) a sampled row draws for (seed, offset): key = seed,
// counter = (offset low, offset high, 0, 0), the top 53 bits of the first two output words.
// Each offset is its own counter, so consecutive steps never share random bits.
__host__ __device__ __forceinline__ double PhiloxUniform(uint64_t seed, uint64_t offset) {
  const Philox4x32 out = Philox4x32x10(
      Philox4x32{{static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (uint64_t{out.v[0]} << 32) | out.v[1];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace kvmesh::kernels
