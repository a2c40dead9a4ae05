// Host emulation (see ../prelude.h) of ../../mma_bf16.cuh: the same functions, run by the
// 32 std::threads of a warp together. Layouts from the PTX ISA (g = lane / 4, c = lane % 4):
//   mma m16n8k16 A: a0 (row g, k 2c..2c+1), a1 (row g+8, same k), a2 (row g, k 2c+8..),
//                   a3 (row g+8, k 2c+8..); B: b0 (k 2c..2c+1, col g), b1 (k 2c+8.., col g);
//                   C/D: (row g, cols 2c, 2c+1), then (row g+8, the same cols).
//   ldmatrix .x4: lanes 8i..8i+7 address the rows of matrix i; lane t gets, per matrix,
//                   (row t/4, cols 2(t%4) low and 2(t%4)+1 high); with .trans
//                   (row 2(t%4), col t/4) low and (row 2(t%4)+1, col t/4) high.
//   cp.async: the copy lands when a wait_group retires its group, not before.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include <cuda_bf16.h>

namespace kvmesh::kernels::prefill {

namespace he = ::kvmesh::kernels::host_emulation;

inline void EmulationCheck(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "host emulation: %s\n", what);
    std::abort();
  }
}

inline uint32_t SharedAddress(const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  EmulationCheck(b >= he::cta.shared_base && b < he::cta.shared_base + he::cta.shared_bytes,
                 "address outside the CTA's shared memory");
  return static_cast<uint32_t>(b - he::cta.shared_base);
}

inline float Bf16ToFloatForEmulation(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  he::Warp& w = he::MyWarp();
  const int lane = he::MyLane();
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  std::memcpy(w.slot[lane], mine, sizeof(mine));
  w.barrier.arrive_and_wait();
  float am[16][16], bm[16][8];
  for (int t = 0; t < he::kWarpSize; ++t) {
    uint32_t r[6];
    std::memcpy(r, w.slot[t], sizeof(r));
    const int g = t / 4, c = t % 4;
    for (int h = 0; h < 2; ++h) {
      am[g][2 * c + h] = Bf16ToFloatForEmulation((r[0] >> (16 * h)) & 0xffffu);
      am[g + 8][2 * c + h] = Bf16ToFloatForEmulation((r[1] >> (16 * h)) & 0xffffu);
      am[g][2 * c + 8 + h] = Bf16ToFloatForEmulation((r[2] >> (16 * h)) & 0xffffu);
      am[g + 8][2 * c + 8 + h] = Bf16ToFloatForEmulation((r[3] >> (16 * h)) & 0xffffu);
      bm[2 * c + h][g] = Bf16ToFloatForEmulation((r[4] >> (16 * h)) & 0xffffu);
      bm[2 * c + 8 + h][g] = Bf16ToFloatForEmulation((r[5] >> (16 * h)) & 0xffffu);
    }
  }
  w.barrier.arrive_and_wait();  // every lane has read every slot
  const int g = lane / 4, c = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * c + (e & 1);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += am[row][k] * bm[k][col];
    d[e] = acc;
  }
}

// ldmatrix .x4 on the warp: each lane publishes its row address, then reads its four
// registers, register i from matrix i through `element(rows of matrix i, lane)`.
template <typename Element>
inline void LdMatrixX4Emulated(uint32_t (&r)[4], uint32_t smem_addr, Element element) {
  he::Warp& w = he::MyWarp();
  const int lane = he::MyLane();
  EmulationCheck(smem_addr % 16 == 0 && smem_addr + 16 <= he::cta.shared_bytes, "ldmatrix row address");
  std::memcpy(w.slot[lane], &smem_addr, sizeof(smem_addr));
  w.barrier.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    uint32_t rows[8];
    for (int k = 0; k < 8; ++k) std::memcpy(&rows[k], w.slot[i * 8 + k], sizeof(rows[k]));
    r[i] = element(rows, lane);
  }
  w.barrier.arrive_and_wait();
}

inline uint16_t SharedB16(uint32_t byte_address) {
  uint16_t v;
  std::memcpy(&v, he::cta.shared_base + byte_address, sizeof(v));
  return v;
}

inline void LdMatrixX4(uint32_t (&r)[4], uint32_t smem_addr) {
  LdMatrixX4Emulated(r, smem_addr, [](const uint32_t (&rows)[8], int t) {
    const uint32_t at = rows[t / 4] + (t % 4) * 4;  // cols 2(t%4) (low) and 2(t%4)+1 (high)
    return uint32_t{SharedB16(at)} | (uint32_t{SharedB16(at + 2)} << 16);
  });
}

inline void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t smem_addr) {
  LdMatrixX4Emulated(r, smem_addr, [](const uint32_t (&rows)[8], int t) {
    const uint32_t col = (t / 4) * 2;  // rows 2(t%4) (low) and 2(t%4)+1 (high)
    return uint32_t{SharedB16(rows[2 * (t % 4)] + col)} | (uint32_t{SharedB16(rows[2 * (t % 4) + 1] + col)} << 16);
  });
}

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;  // nullptr: zero fill
};
inline thread_local std::vector<PendingCopy> open_group;
inline thread_local std::deque<std::vector<PendingCopy>> committed_groups;

inline void CpAsync16(void* smem_dst, const void* global_src, bool valid) {
  const uint32_t at = SharedAddress(smem_dst);
  EmulationCheck(at % 16 == 0 && at + 16 <= he::cta.shared_bytes, "cp.async destination");
  EmulationCheck(reinterpret_cast<uintptr_t>(global_src) % 16 == 0, "cp.async source not 16-byte aligned");
  open_group.push_back({static_cast<unsigned char*>(smem_dst), valid ? static_cast<const unsigned char*>(global_src)
                                                                     : nullptr});
}
inline void CpAsyncCommit() {
  committed_groups.push_back(std::move(open_group));
  open_group.clear();
}
template <int kPending>
inline void CpAsyncWait() {
  while (static_cast<int>(committed_groups.size()) > kPending) {
    for (const PendingCopy& c : committed_groups.front()) {
      if (c.src != nullptr) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    committed_groups.pop_front();
  }
}

inline uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(v.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(v.y)) << 16);
}

}  // namespace kvmesh::kernels::prefill
