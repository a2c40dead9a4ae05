// The two kernels of paged-attention decode (paged_attention_decode.h): the partition
// kernel (one CTA per KV-head tile, sequence and 512-token partition) and the reduce kernel
// that combines the partitions of a sequence in partition order.
//
// Partition kernel, kThreads = 128 threads, TC = KvVector<T>::kElems (4 for f32, 8 else):
//  1. q of the CTA's kGroup query heads -> shared [D][kGroup], times scale * log2(e) (and the
//     fp8 K scale); the partition's block ids -> shared.
//  2. Logits: thread t owns the TC tokens of K chunk t / kDimSplit and the dimensions
//     d = t % kDimSplit (mod kDimSplit); it reads its K rows with TC-wide loads (row d of a
//     K head holds B consecutive tokens), kGroup * TC accumulators, then the kDimSplit
//     threads of a chunk (adjacent lanes) add up by shuffles. Logits -> shared [P][kGroup].
//  3. Softmax over the partition: block max, exp2, block sum (fixed order: deterministic).
//  4. P.V: thread t owns V chunk t % (D / TC) (TC dimensions) of tokens t / (D / TC) +
//     k * kTokenLanes; kGroup * TC accumulators; lanes then warps add up (fixed order).
//  5. Direct path (one partition in the grid): out = acc * (1 / sum). Split path:
//     workspace gets acc (unnormalized), the max and the sum.
// Reduce: M = max of the partitions' maxima, w_i = exp2(m_i - M) (exactly 1 where m_i ==
// M), out = (sum_i acc_i w_i) * (1 / sum_i s_i w_i), partitions in order. With one valid
// partition that is acc_0 * (1 / s_0): the direct path's bits.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "paged_attention_decode/kv_vector.cuh"

namespace kvmesh::kernels::paged_attention_decode {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kPartitionTokens = 512;
inline constexpr int kMinBlockSizeTokens = 8;
inline constexpr float kLog2e = 1.4426950408889634f;

struct PartitionParams {
  const float* q;              // [num_seqs, num_heads, D]
  const void* kv_cache;        // one layer's pool
  const int32_t* context_lens;  // [num_seqs]
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  const float* k_scale;        // [num_kv_heads] or null (not fp8)
  const float* v_scale;        // [num_kv_heads] or null (not fp8)
  float* out;                  // [num_seqs, num_heads, D]: direct path
  float* partial_out;          // [num_seqs, num_heads, num_partitions, D]: split path
  float* partial_max;          // [num_seqs, num_heads, num_partitions] (log2 domain)
  float* partial_sum;          // [num_seqs, num_heads, num_partitions]
  int32_t num_heads, num_kv_heads, group, head_tiles;
  int32_t block_size_tokens, log2_block_size, max_blocks_per_seq;
  int32_t max_context_len, num_partitions;
  float q_multiplier;  // scale * log2(e)
};

// context_lens[seq] clamped to what the grid and the block table cover.
__device__ __forceinline__ int32_t EffectiveContextLen(const int32_t* context_lens, int32_t seq,
                                                       int32_t max_context_len, int32_t max_blocks_per_seq,
                                                       int32_t block_size_tokens) {
  const int64_t table_tokens = int64_t{max_blocks_per_seq} * block_size_tokens;
  int64_t ctx = context_lens[seq];
  if (ctx > max_context_len) ctx = max_context_len;
  if (ctx > table_tokens) ctx = table_tokens;
  return static_cast<int32_t>(ctx);
}

template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads) PartitionKernel(const PartitionParams p) {
  using Vec = KvVector<T>;
  constexpr int kTc = Vec::kElems;
  constexpr int kChunks = kPartitionTokens / kTc;  // K chunks of a partition
  static_assert(kThreads % kChunks == 0, "every K chunk needs whole threads");
  constexpr int kDimSplit = kThreads / kChunks;  // threads sharing one K chunk's dimensions
  static_assert(kDimSplit == 1 || kDimSplit == 2 || kDimSplit == 4, "shuffle partners must be adjacent lanes");
  constexpr int kDimsPerThread = kHeadDim / kDimSplit;
  // Loads in flight per thread before the first use: 128 bytes (8 x 16 or 16 x 8). With 4-7
  // CTAs of 128 threads per SM that is 64-112 KB per SM, past what HBM latency needs.
  constexpr int kUnroll = 128 / static_cast<int>(sizeof(typename Vec::Raw));
  constexpr int kKUnroll = kUnroll;
  static_assert(kDimsPerThread % kKUnroll == 0, "");
  constexpr int kVChunks = kHeadDim / kTc;  // V chunks per row
  static_assert(kVChunks <= 32 && 32 % kVChunks == 0, "a V row's chunks must tile a warp");
  static_assert(kThreads % kVChunks == 0, "");
  constexpr int kTokenLanes = kThreads / kVChunks;
  constexpr int kVUnroll = kUnroll;
  constexpr bool kFp8 = sizeof(T) == 1;
  // Logit rows of one K chunk are followed by kLogitPad floats, so the chunk owners' stores
  // (one chunk per lane) fall in different banks.
  constexpr int kLogitPad = 4;
  constexpr int kLogitFloats = kPartitionTokens * kGroup + kChunks * kLogitPad;
  constexpr int kPartialFloats = kWarps * kGroup * kHeadDim;
  constexpr int kScratchFloats = kLogitFloats > kPartialFloats ? kLogitFloats : kPartialFloats;
  // Index of token ti's kGroup logits (16-byte aligned when kGroup % 4 == 0).
  auto logit_index = [](int ti) { return ti * kGroup + (ti / kTc) * kLogitPad; };

  __shared__ __align__(16) float q_s[kHeadDim * kGroup];  // [D][kGroup], pre-multiplied
  // [P][kGroup] logits, then exp2(logit - max); after P.V, [kWarps][kGroup][D] partial outputs.
  __shared__ __align__(16) float scratch_s[kScratchFloats];
  __shared__ int32_t blocks_s[kPartitionTokens / kMinBlockSizeTokens];
  __shared__ float warp_max_s[kWarps][kGroup];
  __shared__ float warp_sum_s[kWarps][kGroup];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int kv_head = static_cast<int>(blockIdx.x) / p.head_tiles;
  const int first_in_group = (static_cast<int>(blockIdx.x) - kv_head * p.head_tiles) * kGroup;
  const int seq = static_cast<int>(blockIdx.y);
  const int part = static_cast<int>(blockIdx.z);
  const int64_t seq_head0 = int64_t{seq} * p.num_heads + int64_t{kv_head} * p.group;  // row of query head 0 of the group
  const int ctx =
      EffectiveContextLen(p.context_lens, seq, p.max_context_len, p.max_blocks_per_seq, p.block_size_tokens);
  const int part_start = part * kPartitionTokens;
  if (part_start >= ctx) {
    // Nothing to attend to. The split path's reduce skips this partition; on the direct
    // path an empty context (ctx <= 0, a broken precondition) still gets defined zeros.
    if (part == 0 && p.num_partitions == 1) {
      for (int i = tid; i < kGroup * kHeadDim; i += kThreads) {
        const int g = i / kHeadDim;
        if (first_in_group + g < p.group) p.out[(seq_head0 + first_in_group + g) * kHeadDim + i % kHeadDim] = 0.f;
      }
    }
    return;  // uniform across the CTA: no barrier has been reached yet
  }
  const int n_valid = min(kPartitionTokens, ctx - part_start);
  const int block_size = p.block_size_tokens;
  const int log2_block = p.log2_block_size;
  const int n_blocks = (n_valid + block_size - 1) >> log2_block;

  // 1. q and the block ids.
  const float q_mult = kFp8 ? p.q_multiplier * p.k_scale[kv_head] : p.q_multiplier;
  for (int i = tid; i < kHeadDim * kGroup; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i - g * kHeadDim;
    const int gh = first_in_group + g;
    q_s[d * kGroup + g] = gh < p.group ? p.q[(seq_head0 + gh) * kHeadDim + d] * q_mult : 0.f;
  }
  const int32_t* table = p.block_tables + int64_t{seq} * p.max_blocks_per_seq + (part_start >> log2_block);
  for (int i = tid; i < n_blocks; i += kThreads) blocks_s[i] = table[i];
  __syncthreads();

  const T* kv = static_cast<const T*>(p.kv_cache);
  const int64_t head_elems = int64_t{block_size} * kHeadDim;               // one head of K (or V) in a block
  const int64_t block_stride = 2 * int64_t{p.num_kv_heads} * head_elems;  // one block, K and V, all heads
  const int64_t k_head_offset = int64_t{kv_head} * head_elems;
  const int64_t v_head_offset = int64_t{p.num_kv_heads + kv_head} * head_elems;

  // 2. Logits.
  {
    const int split = tid % kDimSplit;
    const int tok0 = (tid / kDimSplit) * kTc;
    float s[kGroup][kTc];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int t = 0; t < kTc; ++t) s[g][t] = 0.f;
    }
    if (tok0 < n_valid) {
      // Row d of this K head holds the block's B tokens; the chunk is TC of them. Tokens
      // past n_valid in the chunk are read (the block is allocated) but never used.
      const T* k_rows = kv + int64_t{blocks_s[tok0 >> log2_block]} * block_stride + k_head_offset +
                        (tok0 & (block_size - 1));
#pragma unroll 1
      for (int i0 = 0; i0 < kDimsPerThread; i0 += kKUnroll) {
        typename Vec::Raw raw[kKUnroll];
#pragma unroll
        for (int u = 0; u < kKUnroll; ++u) {
          raw[u] = Vec::Load(k_rows + int64_t{(i0 + u) * kDimSplit + split} * block_size);
        }
#pragma unroll
        for (int u = 0; u < kKUnroll; ++u) {
          float k[kTc];
          Vec::Decode(raw[u], k);
          float qv[kGroup];
          LoadSharedRow(q_s + ((i0 + u) * kDimSplit + split) * kGroup, qv);
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
#pragma unroll
            for (int t = 0; t < kTc; ++t) s[g][t] = fmaf(qv[g], k[t], s[g][t]);
          }
        }
      }
    }
    // The kDimSplit threads of a chunk are adjacent lanes of one warp; all lanes shuffle.
#pragma unroll
    for (int offset = 1; offset < kDimSplit; offset *= 2) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
#pragma unroll
        for (int t = 0; t < kTc; ++t) s[g][t] += __shfl_xor_sync(0xffffffffu, s[g][t], offset);
      }
    }
    // After the shuffles every thread of the chunk holds all its sums; each stores its share.
#pragma unroll
    for (int t = 0; t < kTc; ++t) {
      if (t % kDimSplit == split && tok0 + t < n_valid) {
        float* dst = scratch_s + logit_index(tok0 + t);
        if constexpr (kGroup % 4 == 0) {
#pragma unroll
          for (int g = 0; g < kGroup; g += 4) {
            reinterpret_cast<float4*>(dst)[g / 4] = make_float4(s[g][t], s[g + 1][t], s[g + 2][t], s[g + 3][t]);
          }
        } else {
#pragma unroll
          for (int g = 0; g < kGroup; ++g) dst[g] = s[g][t];
        }
      }
    }
  }
  __syncthreads();

  // 3. Softmax over the partition's n_valid tokens.
  float row_max[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) row_max[g] = -INFINITY;
  for (int ti = tid; ti < n_valid; ti += kThreads) {
    float l[kGroup];
    LoadSharedRow(scratch_s + logit_index(ti), l);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) row_max[g] = fmaxf(row_max[g], l[g]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) row_max[g] = fmaxf(row_max[g], __shfl_xor_sync(0xffffffffu, row_max[g], offset));
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) warp_max_s[warp][g] = row_max[g];
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    row_max[g] = warp_max_s[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) row_max[g] = fmaxf(row_max[g], warp_max_s[w][g]);
  }
  float row_sum[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) row_sum[g] = 0.f;
  for (int ti = tid; ti < n_valid; ti += kThreads) {
    float l[kGroup];
    LoadSharedRow(scratch_s + logit_index(ti), l);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float e = exp2f(l[g] - row_max[g]);
      scratch_s[logit_index(ti) + g] = e;
      row_sum[g] += e;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) row_sum[g] += __shfl_xor_sync(0xffffffffu, row_sum[g], offset);
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) warp_sum_s[warp][g] = row_sum[g];
  }
  __syncthreads();  // also publishes the exponentials to every thread

  // 4. P.V.
  const int v_chunk = tid % kVChunks;
  float acc[kGroup][kTc];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int e = 0; e < kTc; ++e) acc[g][e] = 0.f;
  }
  {
    const T* v_base = kv + v_head_offset + v_chunk * kTc;
#pragma unroll 1
    for (int t0 = tid / kVChunks; t0 < n_valid; t0 += kTokenLanes * kVUnroll) {
      typename Vec::Raw raw[kVUnroll];
#pragma unroll
      for (int u = 0; u < kVUnroll; ++u) {
        const int ti = t0 + u * kTokenLanes;
        if (ti < n_valid) {
          raw[u] = Vec::Load(v_base + int64_t{blocks_s[ti >> log2_block]} * block_stride +
                             int64_t{ti & (block_size - 1)} * kHeadDim);
        } else {
          raw[u] = typename Vec::Raw{};
        }
      }
#pragma unroll
      for (int u = 0; u < kVUnroll; ++u) {
        const int ti = t0 + u * kTokenLanes;
        if (ti < n_valid) {
          float v[kTc];
          Vec::Decode(raw[u], v);
          float pr[kGroup];
          LoadSharedRow(scratch_s + logit_index(ti), pr);
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
#pragma unroll
            for (int e = 0; e < kTc; ++e) acc[g][e] = fmaf(pr[g], v[e], acc[g][e]);
          }
        }
      }
    }
  }
  // Lanes with the same V chunk (xor of multiples of kVChunks) add up, then warps in order.
#pragma unroll
  for (int offset = kVChunks; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int e = 0; e < kTc; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
    }
  }
  __syncthreads();  // everyone is done reading the exponentials: scratch_s becomes [kWarps][kGroup][D]
  if (lane < kVChunks) {
    static_assert(kTc % 4 == 0, "");
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float4* dst = reinterpret_cast<float4*>(scratch_s + (warp * kGroup + g) * kHeadDim + v_chunk * kTc);
#pragma unroll
      for (int e = 0; e < kTc; e += 4) dst[e / 4] = make_float4(acc[g][e], acc[g][e + 1], acc[g][e + 2], acc[g][e + 3]);
    }
  }
  __syncthreads();

  // 5. Output.
  const float v_scale = kFp8 ? p.v_scale[kv_head] : 1.f;
  for (int i = tid; i < kGroup * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim;
    const int d = i - g * kHeadDim;
    if (first_in_group + g >= p.group) continue;
    float o = scratch_s[g * kHeadDim + d];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) o += scratch_s[(w * kGroup + g) * kHeadDim + d];
    if (kFp8) o *= v_scale;
    float sum = warp_sum_s[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += warp_sum_s[w][g];
    const int64_t row = seq_head0 + first_in_group + g;
    if (p.num_partitions == 1) {
      p.out[row * kHeadDim + d] = o * (1.f / sum);
    } else {
      const int64_t slot = row * p.num_partitions + part;
      p.partial_out[slot * kHeadDim + d] = o;
      if (d == 0) {
        float m = warp_max_s[0][g];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_max_s[w][g]);
        p.partial_max[slot] = m;
        p.partial_sum[slot] = sum;
      }
    }
  }
}

struct ReduceParams {
  const int32_t* context_lens;
  const float* partial_out;  // [num_seqs, num_heads, num_partitions, D]
  const float* partial_max;  // [num_seqs, num_heads, num_partitions]
  const float* partial_sum;  // [num_seqs, num_heads, num_partitions]
  float* out;                // [num_seqs, num_heads, D]
  int32_t num_heads, block_size_tokens, max_blocks_per_seq, max_context_len, num_partitions;
};

// One CTA per (head, sequence), one thread per dimension.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) ReduceKernel(const ReduceParams p) {
  const int head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int d = static_cast<int>(threadIdx.x);
  const int ctx =
      EffectiveContextLen(p.context_lens, seq, p.max_context_len, p.max_blocks_per_seq, p.block_size_tokens);
  const int64_t row = int64_t{seq} * p.num_heads + head;
  float* out = p.out + row * kHeadDim + d;
  if (ctx <= 0) {
    *out = 0.f;
    return;
  }
  const int n = min((ctx + kPartitionTokens - 1) / kPartitionTokens, p.num_partitions);
  const float* maxima = p.partial_max + row * p.num_partitions;
  const float* sums = p.partial_sum + row * p.num_partitions;
  const float* partial = p.partial_out + row * p.num_partitions * kHeadDim + d;
  float global_max = maxima[0];
  for (int i = 1; i < n; ++i) global_max = fmaxf(global_max, maxima[i]);
  float numerator = 0.f;
  float denominator = 0.f;
  for (int i = 0; i < n; ++i) {
    // NOTE: exactly 1 for the maximal partition, so a single partition gives acc * (1 / s),
    // the direct path's bits.
    const float w = maxima[i] == global_max ? 1.f : exp2f(maxima[i] - global_max);
    if (i == 0) {
      numerator = partial[0] * w;
      denominator = sums[0] * w;
    } else {
      numerator = fmaf(partial[int64_t{i} * kHeadDim], w, numerator);
      denominator = fmaf(sums[i], w, denominator);
    }
  }
  *out = numerator * (1.f / denominator);
}

}  // namespace kvmesh::kernels::paged_attention_decode
