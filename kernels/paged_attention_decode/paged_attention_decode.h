// Paged-attention DECODE on the GPU: one query token per sequence attends to its whole
// cached context in one layer's paged KV pool (libs/kv/kv_layout.h), grouped-query aware
// and split over the KV length ("flash-decoding", vLLM's paged_attention_v2).
//
//   layer pool = [num_blocks][2 (K, V)][num_kv_heads][B x D]
//   K head of a block: [head_dim][block_size_tokens]  (dimension-major)
//   V head of a block: [block_size_tokens][head_dim]  (token-major)
//
// Work split: one CTA per (KV head, sequence, partition of kPartitionTokens = 512 tokens at
// ABSOLUTE positions [i*512, (i+1)*512)). A CTA handles every query head of its KV head
// (up to 8 at once; larger groups take several CTAs), so each KV element is read from HBM
// once per step (groups of 3, 5, 6, 7 compute a few masked heads; larger groups re-read
// the KV once per 8 heads). K rows (B tokens of one dimension) and V rows (D dimensions of
// one token) are read with 16-byte loads (8-byte for fp8), 128 bytes in flight per thread.
// Supported: head_dim 64 or 128; block_size_tokens a power of two in [8, 512] (16 is the
// tuned case); f32, bf16 and fp8 e4m3 pools; any group size. When max_context_len > 512
// each CTA writes its unnormalized partial output, its maximum logit and its sum of
// exponentials to the workspace, and a second kernel combines the partitions in partition
// order. Because partitions are absolute and the combination order is fixed, a sequence's
// output is bitwise the same whatever the batch around it and whatever max_context_len is
// (a sequence with one partition gives the same bits on the direct path and on the split
// path). Parallelism is num_kv_heads * num_seqs * partitions CTAs: batch 1 at short
// contexts fills few SMs (16 CTAs for Llama-3-8B at 1k tokens).
//
// Numerics: K/V widened to f32 (bf16 exactly; fp8 e4m3 exactly, times the head's scale,
// which is folded into q for K and into the output for V), f32 accumulation, softmax in
// base 2 with the logits pre-multiplied by log2(e). Versus the CPU backends'
// PagedAttention on the same (for fp8: dequantized) pool, max |out - ref| <= 2e-5 * (1 +
// |ref|): only f32 rounding of a different summation order.
//
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/kv_cache_element.cuh"

namespace kvmesh::kernels {

// Tokens of one split-K partition (absolute positions [i * 512, (i + 1) * 512)).
inline constexpr int32_t kPagedAttentionDecodePartitionTokens = 512;

struct PagedAttentionDecodeArgs {
  const float* q = nullptr;               // [num_seqs, num_heads, head_dim] f32, device: ONE query token per sequence
  const void* kv_cache = nullptr;         // one layer's pool (layout above), element type kv_dtype, device, 16-byte aligned
  const int32_t* context_lens = nullptr;  // [num_seqs] device; >= 1. The query is position context_lens[s]-1 and
                                          // attends to positions 0..context_lens[s]-1
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] device; the first
                                          // ceil(context_lens[s] / B) entries of row s are valid block ids
  const float* k_scale = nullptr;         // [num_kv_heads] device, FP8 only (else ignored, may be null)
  const float* v_scale = nullptr;         // [num_kv_heads] device, FP8 only
  float* out = nullptr;                   // [num_seqs, num_heads, head_dim] f32, device
  int32_t num_seqs = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size_tokens = 0, max_blocks_per_seq = 0;
  // Host-known upper bound on every context_lens[s]; sizes the grid. May be far above the
  // actual lengths (a CUDA graph captures the grid once for the model's max length): CTAs whose
  // partition starts past their sequence's length exit at once, and the reduce skips them.
  // A context_lens[s] above it (or above max_blocks_per_seq * B) is clamped to it, so memory
  // stays in bounds; a context_lens[s] <= 0 gives zeros.
  int32_t max_context_len = 0;
  float scale = 0;                        // softmax scale (1/sqrt(head_dim) in practice)
  KvCacheDType kv_dtype = KvCacheDType::kF32;
};

// Scratch the launch needs (split-K partial outputs, maxima and sums), in bytes: 0 when
// max_context_len <= kPagedAttentionDecodePartitionTokens (no split), else
// num_seqs * num_heads * ceil(max_context_len / 512) * (head_dim + 2) * 4. 0 for
// non-positive sizes.
size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionDecodeArgs& args);

// Launches the decode attention on `stream` (one kernel, or two when the context is split).
// `workspace`: device memory of at least PagedAttentionDecodeWorkspaceBytes(args) bytes
// (may be null when that is 0); it is scratch, nothing is kept between calls.
// cudaErrorInvalidValue, launching nothing, for: a null pointer (k_scale/v_scale only for
// FP8), a non-positive size, num_heads % num_kv_heads != 0, head_dim not 64 or 128,
// block_size_tokens not a power of two in [8, 512], num_seqs or the partition count above
// 65535 (grid limits), kv_cache not 16-byte aligned, an unknown kv_dtype, or a workspace
// that is too small. Otherwise the launch error, if any.
cudaError_t LaunchPagedAttentionDecode(const PagedAttentionDecodeArgs& args, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream);

}  // namespace kvmesh::kernels
