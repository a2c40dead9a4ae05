// Runs a kernel's grid on the host (see prelude.h): CTA by CTA (x fastest), each CTA as one
// std::thread per CUDA thread with a fresh CTA barrier and fresh warps. Slow (threads are
// expensive): small grids only.
#pragma once

#include <cstring>
#include <thread>
#include <vector>

#include "host_emulation/prelude.h"

namespace kvmesh::kernels::host_emulation {

// A kernel's dynamic (`extern __shared__`) memory: filled with 0xff before each CTA (NaN in
// f32 and bf16), so a read before the CTA's own write shows.
struct DynamicShared {
  unsigned char* base = nullptr;
  size_t bytes = 0;
};

// `kernel` (a callable) executes one CUDA thread's code; it is called on each CTA's threads
// with threadIdx, blockIdx, blockDim and gridDim set. Threads per CTA: a multiple of 32 for a
// kernel that shuffles (a partial warp's barrier would wait for lanes that do not exist).
template <typename Kernel>
void EmulateGrid(dim3 grid, dim3 block, const Kernel& kernel, DynamicShared shared = {}) {
  const unsigned threads_per_cta = block.x * block.y * block.z;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        if (shared.base != nullptr) std::memset(shared.base, 0xff, shared.bytes);
        std::barrier<> barrier(threads_per_cta);
        std::vector<Warp> warps((threads_per_cta + kWarpSize - 1) / kWarpSize);
        cta = Cta{.block_idx = uint3{x, y, z},
                  .block_dim = block,
                  .grid_dim = grid,
                  .barrier = &barrier,
                  .warps = warps.data(),
                  .shared_base = shared.base,
                  .shared_bytes = shared.bytes};
        std::vector<std::thread> threads;
        threads.reserve(threads_per_cta);
        for (unsigned tz = 0; tz < block.z; ++tz) {
          for (unsigned ty = 0; ty < block.y; ++ty) {
            for (unsigned tx = 0; tx < block.x; ++tx) {
              threads.emplace_back([&kernel, tx, ty, tz] {
                thread_idx = uint3{tx, ty, tz};
                kernel();
              });
            }
          }
        }
        for (std::thread& th : threads) th.join();
      }
    }
  }
}

template <typename Kernel>
void EmulateGrid(dim3 grid, unsigned threads_per_cta, const Kernel& kernel, DynamicShared shared = {}) {
  EmulateGrid(grid, dim3(threads_per_cta), kernel, shared);
}

}  // namespace kvmesh::kernels::host_emulation
