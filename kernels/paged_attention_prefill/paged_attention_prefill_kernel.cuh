// The prefill attention kernel (FlashAttention-2 over the paged pool); the launchers and
// their contract are in paged_attention_prefill.h.
//
// Work split. One CTA = 4 warps of ONE query head of one sequence; each warp owns kMTiles
// m16 tiles of query rows (16 or 32 rows; a CTA 64 or 128) and keeps their O (f32) and
// softmax state in registers. With one m16 tile the warp's Q lives in registers as bf16 mma
// A fragments; with two it lives in shared memory (registers would not hold both tiles' Q,
// O and S) and is read with ldmatrix, and every K/V B fragment read from shared memory
// feeds two mma instead of one. NOTE: one query head per CTA, not the whole GQA group of a
// KV head: prefill chunks are long, so the rows of one head already fill the m16 tiles, and
// the group's other heads read the same K/V tiles from L2 (a 64-key tile of one KV head is
// 16 KB in bf16 at D = 128). Decode rows (n_s = 1) mixed into a batch use one warp of the
// four (the other warps skip the math); pure decode batches belong to the decode kernel.
//
// KV tiles. kKeys (64) keys per tile, double-buffered in shared memory as bf16 and kept in
// the pool's own orientation: K as [D][kKeys] (dimension-major, like the pool's K block) and
// V as [kKeys][D]. In both, rows are the mma's k and contiguous columns its n, so ldmatrix
// .trans yields the B fragments of S = Q K^T (k = dimension) and of O += P V (k = key)
// directly. Rows are padded by 16 bytes so the 8 rows of one ldmatrix hit distinct banks.
// A 16-byte copy is 8 consecutive keys of one dimension (K) or 8 dimensions of one key (V);
// block_size_tokens % 8 == 0 keeps each within one block and 16-byte aligned.
//
// Softmax. Scores scaled by scale * log2(e) and exponentiated with exp2; running max and sum
// per row in f32; a key is visible to a row iff key <= min(row position, context - 1), which
// masks causally and hides the unwritten tail of the last block (its K may be NaN; its V is
// zero-filled). KV tiles wholly past the CTA's last row position are never loaded.
#pragma once

#include <cstdint>

#include "common/kv_cache_element.cuh"
#include "paged_attention_prefill/kv_tile_loader.cuh"
#include "paged_attention_prefill/mma_bf16.cuh"
#include "paged_attention_prefill/paged_attention_prefill.h"

namespace kvmesh::kernels::prefill {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kKeys = 64;  // keys per KV tile
inline constexpr int kChunk = 8;  // elements per 16-byte bf16 chunk

// Shared-memory geometry of one head_dim and warp row count, in bf16 elements.
template <int kHeadDim, int kMTiles>
struct TileGeometry {
  static_assert(kMTiles == 1 || kMTiles == 2);
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per CTA
  static constexpr int kKPitch = kKeys + 8;      // K tile row (one dimension), padded by 16 bytes
  static constexpr int kVPitch = kHeadDim + 8;   // V tile row (one key), padded by 16 bytes
  static constexpr int kKElems = kHeadDim * kKPitch;
  static constexpr int kVElems = kKeys * kVPitch;
  static constexpr int kStageElems = kKElems + kVElems;
  static constexpr int kStages = 2;
  // Q in shared memory (two m16 tiles per warp only): [kRows][D], padded like V.
  static constexpr int kQPitch = kHeadDim + 8;
  static constexpr int kQElems = kMTiles == 1 ? 0 : kRows * kQPitch;
  static constexpr size_t kSmemBytes = (static_cast<size_t>(kStages) * kStageElems + kQElems) * sizeof(uint16_t);
  // 16-byte chunks per thread per tile.
  static constexpr int kKChunksPerThread = kHeadDim * (kKeys / kChunk) / kThreads;
  static constexpr int kVChunksPerThread = kKeys * (kHeadDim / kChunk) / kThreads;
  static_assert(kHeadDim * (kKeys / kChunk) % kThreads == 0 && kKeys * (kHeadDim / kChunk) % kThreads == 0);
  static_assert((kKPitch * 2) % 16 == 0 && (kVPitch * 2) % 16 == 0 && (kQPitch * 2) % 16 == 0 &&
                (kStageElems * 2) % 16 == 0);
};

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// acc[m][2np] and acc[m][2np+1] += a[m] times one 16 x 16 block of B (k rows, 16 columns):
// the block's four 8x8 matrices come transposed from shared memory at `b_row_address` (this
// lane's row, as ld_row / ld_col pick it) and serve every m16 tile. np must be a constant
// after unrolling, so acc stays in registers.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void MmaColumnPair(float (&acc)[kMTiles][kNTiles][4], const uint32_t (&a)[kMTiles][4], int np,
                                              uint32_t b_row_address) {
  uint32_t b[4];
  LdMatrixX4Trans(b, b_row_address);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    MmaBf16(acc[m][2 * np], a[m], b[0], b[1]);
    MmaBf16(acc[m][2 * np + 1], a[m], b[2], b[3]);
  }
}

// grid.x = num_heads * num_seqs * tiles_per_seq (heads fastest, then sequences, then query
// tiles LAST first so the CTAs with the most KV tiles start first); block = kThreads.
template <typename T, int kHeadDim, int kMTiles>
__global__ void __launch_bounds__(kThreads) PagedAttentionPrefillKernel(const PagedAttentionPrefillArgs args,
                                                                       int32_t tiles_per_seq) {
  using Geo = TileGeometry<kHeadDim, kMTiles>;
  constexpr int kRows = Geo::kRows;
  extern __shared__ __align__(16) uint16_t smem[];

  const int64_t linear = blockIdx.x;
  const int32_t head = static_cast<int32_t>(linear % args.num_heads);
  const int64_t rest = linear / args.num_heads;
  const int32_t seq = static_cast<int32_t>(rest % args.num_seqs);
  const int32_t qtile = tiles_per_seq - 1 - static_cast<int32_t>(rest / args.num_seqs);

  const int32_t q_begin = args.query_start[seq];
  const int32_t n = args.query_start[seq + 1] - q_begin;
  const int32_t ctx = args.context_lens[seq];
  const int32_t row0 = qtile * kRows;
  // Uniform over the CTA, before any barrier: tiles past this sequence's rows, and a
  // context shorter than its rows (a broken precondition: nothing sane to compute).
  if (row0 >= n || ctx < n) return;

  const int32_t kv_head = head / (args.num_heads / args.num_kv_heads);
  const int32_t first_pos = ctx - n;  // position of the sequence's query row 0
  const int32_t last_pos = first_pos + min(n, row0 + kRows) - 1;  // <= ctx - 1
  const int32_t num_kv_tiles = last_pos / kKeys + 1;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;  // fragment row within 8
  const int c = lane % 4;  // fragment column pair
  const int32_t warp_row0 = row0 + warp * Geo::kRowsPerWarp;  // the warp's first row within the sequence
  const bool warp_active = warp_row0 < n;                      // uniform per warp
  // This thread's rows: rows[m][r] = row g (r = 0) or g + 8 (r = 1) of m16 tile m, and the
  // last key each sees (keys past the context are never visible).
  int32_t rows[kMTiles][2], limits[kMTiles][2];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rows[m][r] = warp_row0 + m * 16 + r * 8 + g;
      limits[m][r] = min(first_pos + rows[m][r], ctx - 1);
    }
  }
  const int32_t warp_min_limit = min(first_pos + warp_row0, ctx - 1);
  // ldmatrix row addresses: lane l feeds matrix l/8, row l%8; matrices 0/1 are rows (or k)
  // 0-7/8-15 of columns 0-7, matrices 2/3 the same of columns 8-15. The same order gives
  // mma's A fragment (no .trans, rows = query rows) and B fragment (.trans, rows = k).
  const int ld_row = (lane / 8 % 2) * 8 + lane % 8;
  const int ld_col = (lane / 16) * 8;

  // Q as bf16, rows past n zero: in registers (qf[ks] = A fragment of dimensions
  // 16ks..16ks+15) for one m16 tile; in shared memory after the KV stages for two.
  uint32_t qf[kMTiles == 1 ? kHeadDim / 16 : 1][4];
  uint16_t* const q_smem = smem + Geo::kStages * Geo::kStageElems;
  if constexpr (kMTiles == 1) {
    const float* qa = args.q + (static_cast<int64_t>(q_begin + rows[0][0]) * args.num_heads + head) * kHeadDim;
    const float* qb = args.q + (static_cast<int64_t>(q_begin + rows[0][1]) * args.num_heads + head) * kHeadDim;
    const bool valid_a = rows[0][0] < n, valid_b = rows[0][1] < n;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = ks * 16 + half * 8 + 2 * c;
        const float2 a = valid_a ? __ldg(reinterpret_cast<const float2*>(qa + col)) : make_float2(0.f, 0.f);
        const float2 b = valid_b ? __ldg(reinterpret_cast<const float2*>(qb + col)) : make_float2(0.f, 0.f);
        qf[ks][half * 2 + 0] = PackBf16x2(a.x, a.y);
        qf[ks][half * 2 + 1] = PackBf16x2(b.x, b.y);
      }
    }
  } else {
    // 8 dimensions per thread per step; the first barrier of the KV loop publishes them.
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    for (int chunk = static_cast<int>(threadIdx.x); chunk < kRows * kChunksPerRow; chunk += kThreads) {
      const int row = chunk / kChunksPerRow;
      const int part = chunk % kChunksPerRow;
      uint4 packed = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + row < n) {
        const float4* src = reinterpret_cast<const float4*>(
            args.q + (static_cast<int64_t>(q_begin + row0 + row) * args.num_heads + head) * kHeadDim + part * kChunk);
        const float4 x = __ldg(src), y = __ldg(src + 1);
        packed = make_uint4(PackBf16x2(x.x, x.y), PackBf16x2(x.z, x.w), PackBf16x2(y.x, y.y), PackBf16x2(y.z, y.w));
      }
      *reinterpret_cast<uint4*>(q_smem + row * Geo::kQPitch + part * kChunk) = packed;
    }
  }
  // The A fragment of m16 tile m, dimensions 16ks..16ks+15.
  auto q_fragment = [&](int m, int ks, uint32_t (&a)[4]) {
    if constexpr (kMTiles == 1) {
      a[0] = qf[ks][0];
      a[1] = qf[ks][1];
      a[2] = qf[ks][2];
      a[3] = qf[ks][3];
    } else {
      LdMatrixX4(a, SharedAddress(q_smem + (warp * Geo::kRowsPerWarp + m * 16 + ld_row) * Geo::kQPitch + ks * 16 +
                                  ld_col));
    }
  };

  // The pool: block b starts at element b * 2 * Hkv * B * D; within it K heads, then V heads.
  const T* pool = static_cast<const T*>(args.kv_cache);
  const int32_t bsz = args.block_size_tokens;
  const int64_t head_elems = static_cast<int64_t>(bsz) * kHeadDim;
  const int64_t block_elems = 2 * static_cast<int64_t>(args.num_kv_heads) * head_elems;
  const T* k_head = pool + kv_head * head_elems;
  const T* v_head = pool + (args.num_kv_heads + kv_head) * head_elems;
  const int32_t* table = args.block_tables + static_cast<int64_t>(seq) * args.max_blocks_per_seq;
  float k_scale = 1.f, v_scale = 1.f;
  if constexpr (sizeof(T) == 1) {
    k_scale = args.k_scale[kv_head];
    v_scale = args.v_scale[kv_head];
  }

  // Position p's element 0 of head `head_base` (k_head or v_head): its block from the table,
  // then its offset in the block times the token stride (1 in K's [D][B], D in V's [B][D]).
  // Shifts for a power-of-two block size (B = 16), a division otherwise.
  const bool bsz_pow2 = (bsz & (bsz - 1)) == 0;
  const int32_t bsz_shift = 31 - __clz(bsz);
  auto slot_of = [&](int32_t p, const T* head_base, int32_t token_stride) {
    const int32_t block_index = bsz_pow2 ? p >> bsz_shift : p / bsz;
    const int32_t offset = p - block_index * bsz;
    return head_base + static_cast<int64_t>(__ldg(table + block_index)) * block_elems + offset * token_stride;
  };

  // Fills stage `stage` with KV tile `tile` (keys tile*kKeys ..); keys >= ctx become zeros.
  // NOTE: f32 and FP8 chunks pass through registers (8 per f32 chunk); unrolling all of
  // them would hoist every load and spill, so they go two at a time. bf16 chunks are cp.async.
  [[maybe_unused]] constexpr int kLoadUnroll = sizeof(T) == 2 ? 8 : 2;  // unused where pragmas are not (host emulation)
  constexpr int kKChunksPerRow = kKeys / kChunk;     // 8 chunks cover one dimension's 64 keys
  constexpr int kVChunksPerRow = kHeadDim / kChunk;  // chunks covering one key's dimensions
  static_assert(kThreads % kKChunksPerRow == 0 && kThreads % kVChunksPerRow == 0);
  auto load_tile = [&](int32_t tile, int stage) {
    uint16_t* ks = smem + stage * Geo::kStageElems;
    uint16_t* vs = ks + Geo::kKElems;
    const int32_t key0 = tile * kKeys;
    // K: chunk c = threadIdx.x + i * kThreads has keys 8 * (c % 8) .. + 7, the same for every
    // i (kThreads % 8 == 0): one block lookup, then one dimension per i.
    {
      const int j = static_cast<int>(threadIdx.x) % kKChunksPerRow;
      const int32_t p = key0 + j * kChunk;  // first of 8 keys, all in one block (bsz % 8 == 0)
      const bool valid = p < ctx;
      const T* base = valid ? slot_of(p, k_head, 1) : pool;
#pragma unroll kLoadUnroll
      for (int i = 0; i < Geo::kKChunksPerThread; ++i) {
        const int dim = static_cast<int>(threadIdx.x) / kKChunksPerRow + i * (kThreads / kKChunksPerRow);
        StoreChunkBf16(ks + dim * Geo::kKPitch + j * kChunk, valid ? base + dim * bsz : pool, valid, k_scale);
      }
    }
    // V: chunk c has key c / kVChunksPerRow and dimensions 8 * (c % kVChunksPerRow) .. + 7.
    {
      const int part = static_cast<int>(threadIdx.x) % kVChunksPerRow;
#pragma unroll kLoadUnroll
      for (int i = 0; i < Geo::kVChunksPerThread; ++i) {
        const int key = static_cast<int>(threadIdx.x) / kVChunksPerRow + i * (kThreads / kVChunksPerRow);
        const int32_t p = key0 + key;
        const bool valid = p < ctx;
        const T* src = valid ? slot_of(p, v_head, kHeadDim) + part * kChunk : pool;
        StoreChunkBf16(vs + key * Geo::kVPitch + part * kChunk, src, valid, v_scale);
      }
    }
  };

  float o[kMTiles][kHeadDim / 8][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // row_sum: this thread's share, summed over the quad at the end
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int nd = 0; nd < kHeadDim / 8; ++nd) o[m][nd][0] = o[m][nd][1] = o[m][nd][2] = o[m][nd][3] = 0.f;
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }
  const float scale_log2 = args.scale * 1.4426950408889634f;

  load_tile(0, 0);
  CpAsyncCommit();
  for (int32_t tile = 0; tile < num_kv_tiles; ++tile) {
    // Prefetch the next tile into the other stage (free: the barrier at the end of the
    // previous iteration ordered everyone's reads of it), then wait for this one.
    if (tile + 1 < num_kv_tiles) load_tile(tile + 1, (tile + 1) % 2);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();

    if (warp_active) {
      const uint16_t* ks = smem + (tile % 2) * Geo::kStageElems;
      const uint16_t* vs = ks + Geo::kKElems;

      // S = Q K^T: per m16 tile 16 rows x 64 keys, s[m][j] = keys 8j..8j+7. Each K B fragment
      // serves every m16 tile.
      float s[kMTiles][kKeys / 8][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
      }
#pragma unroll
      for (int kstep = 0; kstep < kHeadDim / 16; ++kstep) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) q_fragment(m, kstep, a[m]);
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          MmaColumnPair(s, a, np, SharedAddress(ks + (kstep * 16 + ld_row) * Geo::kKPitch + np * 16 + ld_col));
        }
      }

      // Scale into log2 units and mask (only tiles reaching past some row's last key).
      const int32_t key0 = tile * kKeys;
      const bool need_mask = key0 + kKeys - 1 > warp_min_limit;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int32_t key = key0 + j * 8 + 2 * c + (e & 1);
            const float x = s[m][j][e] * scale_log2;
            s[m][j][e] = (need_mask && key > limits[m][e / 2]) ? -INFINITY : x;
          }
        }
      }

      // Online softmax: new running max, rescale what was accumulated, exponentiate.
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
          tile_max[0] = fmaxf(tile_max[0], fmaxf(s[m][j][0], s[m][j][1]));
          tile_max[1] = fmaxf(tile_max[1], fmaxf(s[m][j][2], s[m][j][3]));
        }
        float shift[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float new_max = fmaxf(row_max[m][r], QuadMax(tile_max[r]));
          // A row that has seen only masked keys keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
          shift[r] = new_max == -INFINITY ? 0.f : new_max;
          alpha[r] = exp2f(row_max[m][r] - shift[r]);
          row_max[m][r] = new_max;
          row_sum[m][r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[m][j][e] = exp2f(s[m][j][e] - shift[e / 2]);
            row_sum[m][e / 2] += s[m][j][e];
          }
        }
#pragma unroll
        for (int nd = 0; nd < kHeadDim / 8; ++nd) {
          o[m][nd][0] *= alpha[0];
          o[m][nd][1] *= alpha[0];
          o[m][nd][2] *= alpha[1];
          o[m][nd][3] *= alpha[1];
        }
      }

      // O += P V: the S accumulators of keys 16kk..16kk+15 are the A fragment of step kk.
      // Each V B fragment serves every m16 tile.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          a[m][0] = PackBf16x2(s[m][2 * kk][0], s[m][2 * kk][1]);
          a[m][1] = PackBf16x2(s[m][2 * kk][2], s[m][2 * kk][3]);
          a[m][2] = PackBf16x2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
          a[m][3] = PackBf16x2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kHeadDim / 16; ++np) {
          MmaColumnPair(o, a, np, SharedAddress(vs + (kk * 16 + ld_row) * Geo::kVPitch + np * 16 + ld_col));
        }
      }
    }
    // Everyone is done reading this stage before the next iteration refills it.
    __syncthreads();
  }
  CpAsyncWait<0>();  // drain the last (empty) group before exit

  if (!warp_active) return;
  float inv_sum[kMTiles][2];  // every lane shuffles before any lane branches on its rows
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    inv_sum[m][0] = 1.f / QuadSum(row_sum[m][0]);
    inv_sum[m][1] = 1.f / QuadSum(row_sum[m][1]);
  }
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rows[m][r] >= n) continue;
      float* out = args.out + (static_cast<int64_t>(q_begin + rows[m][r]) * args.num_heads + head) * kHeadDim;
#pragma unroll
      for (int nd = 0; nd < kHeadDim / 8; ++nd) {
        *reinterpret_cast<float2*>(out + nd * 8 + 2 * c) =
            make_float2(o[m][nd][2 * r] * inv_sum[m][r], o[m][nd][2 * r + 1] * inv_sum[m][r]);
      }
    }
  }
}

}  // namespace kvmesh::kernels::prefill
