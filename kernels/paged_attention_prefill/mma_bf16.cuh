// Thin inline-PTX wrappers for the prefill attention kernel: bf16 tensor-core MMA
// (m16n8k16, f32 accumulate), ldmatrix (plain and transposed), and cp.async 16-byte copies with zero
// fill. All run on sm_80 and sm_90 (no sm_90a instruction).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvmesh::kernels::prefill {

// d += a * b for one 16x8 tile: a is the 16x16 row-major A fragment (4 regs of bf16x2), b0/b1
// the 16x8 column-major B fragment, d the 16x8 f32 C/D fragment.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; r[i] of lane t
// holds matrix i's elements (row t/4, cols 2*(t%4), 2*(t%4)+1): mma's A fragment when the
// matrices are rows 0-7 / 8-15 of k 0-7, then of k 8-15.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}

// Four 8x8 b16 matrices, transposed: lanes 8i..8i+7 give the row addresses of matrix i;
// r[i] of lane t holds matrix i's elements (row 2*(t%4), col t/4) and (row 2*(t%4)+1, col t/4),
// which is the B fragment of mma m16n8k16 when rows are k and columns are n.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes global -> shared asynchronously; with `valid` false it reads nothing and
// writes 16 zero bytes (src must still be a mapped address).
__device__ __forceinline__ void CpAsync16(void* smem_dst, const void* global_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem_dst)), "l"(global_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two f32 -> one bf16x2 register (round to nearest even), `lo` in the low half: the
// operand order of the mma fragments (lower column first).
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(v.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(v.y)) << 16);
}

}  // namespace kvmesh::kernels::prefill
