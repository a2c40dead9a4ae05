// CUDA's built-ins for host code, so that a kernel's own source compiles with the host
// compiler and runs on std::threads (grid.h: one std::thread per CUDA thread, one CTA at a
// time). For tests on machines without a GPU.
//
// How a test uses it: this header is the translation unit's first include (before any other
// CUDA header: the CUDA headers it includes are parsed as themselves, then __device__ and
// friends are emptied), then the kernel's .cuh, then grid.h runs a launch.
//
// What it emulates: thread and block indices and dimensions, __syncthreads (a CTA-wide
// barrier), warp shuffles (a warp-wide barrier and an exchange slot per lane), int atomics,
// the bit casts and the rounding intrinsics the kernels call. What it cannot check: the hardware's own
// semantics (a shuffle here is what the CUDA guide says it is), the memory model beyond the
// barriers (every thread sees every write at once, so a missing __syncthreads shows only if a
// read happens to run before the write), timing, occupancy, bank conflicts, registers.
#pragma once

// Parsed as the real headers before __device__ is emptied below; their include guards keep
// the kernels' own includes of them from being parsed again.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// kernels/common/kv_cache_element.cuh compiles its device functions for nvcc and for this.
#define KVMESH_HOST_EMULATION 1

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
// Shared arrays declared inside a kernel or device function become function statics, so the
// CTA's threads share them (one CTA runs at a time). They are not poisoned per CTA (GCC 12
// ignores a section attribute on a function template's statics, so there is no range to
// fill): each CTA starts with the previous CTA's leftovers, as a GPU's shared memory often
// does. A kernel with `extern __shared__` dynamic memory redefines this as empty (see
// paged_attention_prefill/host_emulation/prelude.h) and has grid.h poison it per CTA.
#undef __shared__
#define __shared__ static

namespace kvmesh::kernels::host_emulation {

inline constexpr int kWarpSize = 32;

// Per warp: a barrier and one exchange slot per lane for the collectives.
struct Warp {
  std::barrier<> barrier{kWarpSize};
  alignas(16) unsigned char slot[kWarpSize][64];
};

// The CTA being emulated (one at a time): its coordinates, its barrier, its warps and, for a
// kernel with dynamic shared memory, that memory.
struct Cta {
  uint3 block_idx{};
  dim3 block_dim{};
  dim3 grid_dim{};
  std::barrier<>* barrier = nullptr;
  Warp* warps = nullptr;
  unsigned char* shared_base = nullptr;
  size_t shared_bytes = 0;
};
inline Cta cta;
inline thread_local uint3 thread_idx{};

// Warps are cut from the linear thread index (x fastest), as the hardware does.
inline unsigned MyLinearThread() {
  return (thread_idx.z * cta.block_dim.y + thread_idx.y) * cta.block_dim.x + thread_idx.x;
}
inline Warp& MyWarp() { return cta.warps[MyLinearThread() / kWarpSize]; }
inline int MyLane() { return static_cast<int>(MyLinearThread() % kWarpSize); }

// Every lane of the warp gives `v` and gets lane `src_lane(lane)`'s. All 32 lanes must call it
// (the kernels here only shuffle with the full mask).
template <typename T, typename SrcLane>
T WarpExchange(T v, SrcLane src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(Warp::slot[0]));
  Warp& w = MyWarp();
  const int lane = MyLane();
  std::memcpy(w.slot[lane], &v, sizeof(v));
  w.barrier.arrive_and_wait();
  T other;
  std::memcpy(&other, w.slot[src_lane(lane)], sizeof(other));
  w.barrier.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
  return other;
}

}  // namespace kvmesh::kernels::host_emulation

#define threadIdx (::kvmesh::kernels::host_emulation::thread_idx)
#define blockIdx (::kvmesh::kernels::host_emulation::cta.block_idx)
#define blockDim (::kvmesh::kernels::host_emulation::cta.block_dim)
#define gridDim (::kvmesh::kernels::host_emulation::cta.grid_dim)

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline void __syncthreads() { ::kvmesh::kernels::host_emulation::cta.barrier->arrive_and_wait(); }
// The shuffles over a full warp (every kernel here passes the full mask and width 32).
template <typename T>
inline T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask, int /*width*/ = 32) {
  return ::kvmesh::kernels::host_emulation::WarpExchange(v, [lane_mask](int lane) { return lane ^ lane_mask; });
}
// A lane below `delta` keeps its own value, as on the device.
template <typename T>
inline T __shfl_up_sync(unsigned /*mask*/, T v, unsigned delta, int /*width*/ = 32) {
  return ::kvmesh::kernels::host_emulation::WarpExchange(
      v, [delta](int lane) { return lane >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane; });
}
// Atomics on (shared or global) ints: real atomics, the CTA's threads run concurrently.
inline int atomicMax(int* address, int val) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old < val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
inline int atomicMin(int* address, int val) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old > val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
inline float __uint_as_float(uint32_t bits) { return std::bit_cast<float>(bits); }
inline uint32_t __float_as_uint(float x) { return std::bit_cast<uint32_t>(x); }
// IEEE single-precision operations rounded to nearest, never contracted into an fma: what a
// separate host float operation is (x86-64 SSE, no -ffp-contract across these calls).
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
[[gnu::noinline]] inline float __fadd_rn(float a, float b) { return a + b; }
[[gnu::noinline]] inline float __fsub_rn(float a, float b) { return a - b; }
// The device's rsqrtf is approximate (2 ulp); the host's correctly rounded value is within it.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
