// Host emulation of the prefill kernel, for tests on machines without a GPU: the kernel's own
// source (paged_attention_prefill_kernel.cuh) compiled by the host compiler, one std::thread
// per CUDA thread, CUDA's built-ins replaced here and the warp-collective PTX wrappers
// (mma_bf16.cuh) by emulations that follow the PTX ISA's fragment layouts.
//
// How a test uses it: this folder comes first on the include path (so its
// paged_attention_prefill/mma_bf16.cuh and common/kv_cache_element.cuh shadow the real ones),
// this header is the translation unit's first include (before any CUDA header), and
// emulated_launch.h runs a launch. What it checks: indexing, paging, masking, the online
// softmax, the fragment bookkeeping, barrier placement (each cp.async lands only at its
// wait_group; shared memory starts as garbage). What it cannot: the hardware's own
// semantics (it trusts its reading of the PTX ISA), timing, bank conflicts, registers.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__

namespace kvmesh::kernels::host_emulation {

inline constexpr int kWarpSize = 32;

// Per warp: a barrier and one exchange slot per lane for the collectives.
struct Warp {
  std::barrier<> barrier{kWarpSize};
  alignas(16) unsigned char slot[kWarpSize][64];
};

// The CTA being emulated (one at a time): its barrier, its warps, its shared memory.
struct Cta {
  uint3 block_idx{};
  std::barrier<>* barrier = nullptr;
  Warp* warps = nullptr;
  unsigned char* shared_base = nullptr;
  size_t shared_bytes = 0;
};
inline Cta cta;
inline thread_local uint3 thread_idx{};

inline Warp& MyWarp() { return cta.warps[thread_idx.x / kWarpSize]; }
inline int MyLane() { return static_cast<int>(thread_idx.x % kWarpSize); }

}  // namespace kvmesh::kernels::host_emulation

#define threadIdx (::kvmesh::kernels::host_emulation::thread_idx)
#define blockIdx (::kvmesh::kernels::host_emulation::cta.block_idx)

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline void __syncthreads() { ::kvmesh::kernels::host_emulation::cta.barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned /*mask*/, float v, int lane_mask) {
  namespace he = ::kvmesh::kernels::host_emulation;
  he::Warp& w = he::MyWarp();
  const int lane = he::MyLane();
  std::memcpy(w.slot[lane], &v, sizeof(v));
  w.barrier.arrive_and_wait();
  float other;
  std::memcpy(&other, w.slot[lane ^ lane_mask], sizeof(other));
  w.barrier.arrive_and_wait();
  return other;
}
inline int min(int a, int b) { return a < b ? a : b; }
