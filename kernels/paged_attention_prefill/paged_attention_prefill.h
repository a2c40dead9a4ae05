// Prefill attention over one layer's paged KV pool (libs/kv/kv_layout.h), FlashAttention-2
// style on tensor cores: the GPU form of Backend::PagedAttention (libs/backend/ops.h) for a
// mixed batch of prefill chunks (with or without a cached prefix) and decode rows.
//
// Numerics: Q (f32) and K/V are rounded to bf16 (round to nearest even) and multiplied on
// tensor cores (mma.sync m16n8k16, f32 accumulation); an f32 pool is rounded to bf16 on
// load, a bf16 pool is used as stored, an FP8 e4m3 pool is decoded (stored * the KV head's
// scale, kernels/common/kv_cache_element.cuh) and then rounded to bf16. The softmax is online
// in f32 over tiles of 64 keys; the probabilities are rounded to bf16 for P.V. Against the
// CPU backends' f32 result on the same pool and q (tests/unit/kernels/paged_attention_prefill_test.cc):
// max |out - ref| <= 2e-2 * max(1, max |ref|) and ||out - ref|| / ||ref|| <= 1e-2 for
// every pool type (bf16 operands land between 1e-3 and 1e-2).
//
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/kv_cache_element.cuh"

namespace kvmesh::kernels {

// Same semantics as Backend::PagedAttention for a mixed batch: sequence s owns query rows
// query_start[s] .. query_start[s+1]-1 (n_s rows, n_s >= 1: a prefill chunk or a decode
// step), which are the LAST n_s positions of its context of context_lens[s] tokens: row i
// of s sits at position context_lens[s] - n_s + i and attends causally to positions
// 0..that (the earlier positions are the cached prefix, already in the pool; the chunk's
// own K/V have been written to the pool before this call). Query head h reads KV head
// h / (num_heads / num_kv_heads). Position p's K/V lives in block
// block_tables[s * max_blocks_per_seq + p / B] at offset p % B.
struct PagedAttentionPrefillArgs {
  const float* q = nullptr;              // [num_tokens, num_heads, head_dim] f32, device
  const void* kv_cache = nullptr;        // one layer's pool, libs/kv/kv_layout.h layout, element type kv_dtype, device
  const int32_t* query_start = nullptr;  // [num_seqs + 1] device, query_start[0] == 0, ascending
  const int32_t* context_lens = nullptr; // [num_seqs] device, >= n_s
  const int32_t* block_tables = nullptr; // [num_seqs, max_blocks_per_seq] device
  const float* k_scale = nullptr;        // [num_kv_heads] device, FP8 only
  const float* v_scale = nullptr;        // [num_kv_heads] device, FP8 only
  float* out = nullptr;                  // [num_tokens, num_heads, head_dim] f32, device
  int32_t num_seqs = 0, num_tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size_tokens = 0,
          max_blocks_per_seq = 0;
  int32_t max_query_len = 0;             // host-known upper bound on every n_s; sizes the grid
  float scale = 0;
  KvCacheDType kv_dtype = KvCacheDType::kF32;
};

// Enqueues the attention on `stream` and returns the launch's error.
// cudaErrorInvalidValue for bad shapes: a non-positive size, num_heads % num_kv_heads != 0,
// head_dim not in {64, 128}, block_size_tokens not a multiple of 8 (a 16-byte K copy is 8
// consecutive keys of one block), a null pointer (k_scale / v_scale only for FP8), kv_cache
// or q not 16-byte aligned or out not 8-byte aligned (cudaMalloc gives 256), or a grid of
// more than 2^31 - 1 blocks (num_heads * num_seqs * ceil(max_query_len / 64)).
// Preconditions not checked (device data): query_start ascending with n_s <= max_query_len,
// n_s <= context_lens[s], block-table entries of positions < context_lens[s] valid blocks.
// Rows past max_query_len of a sequence would be left unwritten.
// Uses 36 KB (head_dim 64) or 70 KB (head_dim 128) of dynamic shared memory per block.
cudaError_t LaunchPagedAttentionPrefill(const PagedAttentionPrefillArgs& args, cudaStream_t stream);

// Query rows each warp of LaunchPagedAttentionPrefill owns (a CTA has 4 warps).
inline constexpr int32_t kPagedAttentionPrefillRowsPerWarp = 16;

// The same attention with `rows_per_warp` 16 (64-row CTAs, Q in registers) or 32 (128-row
// CTAs, Q in shared memory, each K/V fragment read from shared memory serves two mma: 54 KB /
// 104 KB of shared memory); for benchmarks and tests choosing between the two. The same
// errors, and cudaErrorInvalidValue for another rows_per_warp. NOTE: at head_dim 128 the
// 32-row kernel uses 255 registers: no spills for bf16 and FP8 pools on sm_90, 20-76 bytes of
// spills for f32 pools (and on sm_80) per ptxas; the 16-row kernel spills nowhere.
cudaError_t LaunchPagedAttentionPrefillWithRowsPerWarp(const PagedAttentionPrefillArgs& args, int32_t rows_per_warp,
                                                      cudaStream_t stream);

}  // namespace kvmesh::kernels
