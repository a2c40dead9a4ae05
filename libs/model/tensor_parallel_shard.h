// TensorParallelShard: which slice of a Llama-family model one tensor-parallel rank
// holds (Megatron-style, docs/architecture.md §4, "Tensor parallelism"), and the zero-copy views
// of that slice of the checkpoint.
//
// With N ranks, rank r holds:
//   - query heads [r H/N, (r+1) H/N) of q_proj (column-parallel) and the matching
//     columns of o_proj (row-parallel, its partial sums all-reduced);
//   - KV heads [r Hkv/N, (r+1) Hkv/N) of k_proj/v_proj when N <= Hkv; when N > Hkv
//     (MQA, small GQA) the one KV head its query heads read, replicated on N/Hkv ranks;
//   - intermediate rows [r I/N, (r+1) I/N) of gate/up (column-parallel) and the
//     matching columns of down_proj (row-parallel, all-reduced);
//   - vocabulary rows [r V/N, (r+1) V/N) of embed_tokens and lm_head (vocab-parallel:
//     embedding rows of other ranks' tokens are zero before an all-reduce; logits are
//     all-gathered);
//   - the norms whole; biases sliced like their weights; o_proj's bias on rank 0 only
//     (it is added once, before the all-reduce).
// Views of a slice point into the same mmap as the full model: nothing is copied
// until the backend packs a rank's own slice.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace kvmesh::model {

struct TensorParallelShard {
  int32_t rank = 0;
  int32_t size = 1;
  int64_t num_heads = 0;            // query heads on this rank
  int64_t head_begin = 0;
  int64_t num_kv_heads = 0;         // KV heads on this rank (1 when replicated)
  int64_t kv_head_begin = 0;
  int32_t kv_head_replication = 1;  // ranks holding a copy of each KV head (N / Hkv when N > Hkv)
  int64_t intermediate_size = 0;    // gate/up rows, down columns on this rank
  int64_t intermediate_begin = 0;
  int64_t vocab_size = 0;           // embedding/LM-head rows on this rank
  int64_t vocab_begin = 0;

  bool is_sharded() const { return size > 1; }
};

// Rank `rank` of `size`. InvalidArgument, naming the numbers, when the model cannot be
// split that way: size < 1, rank out of range, num_attention_heads % size, KV heads
// neither divisible by size nor dividing it, intermediate_size % size, or vocab_size %
// size (kvmesh does not pad the vocabulary).
absl::StatusOr<TensorParallelShard> ComputeTensorParallelShard(const ModelConfig& config, int32_t rank,
                                                               int32_t size);

// The rank's slice of `full` (views into the same memory). `full` must match the
// config the shard was computed from.
ModelWeights ShardModelWeights(const ModelWeights& full, const ModelConfig& config, const TensorParallelShard& shard);

}  // namespace kvmesh::model
