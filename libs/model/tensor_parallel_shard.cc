#include "model/tensor_parallel_shard.h"

#include "absl/strings/str_cat.h"

namespace kvmesh::model {
namespace {

// Rows [begin, begin + n) of a [N, K] (or [N]) view.
TensorView Rows(const TensorView& v, int64_t begin, int64_t n) {
  TensorView out = v;
  out.data = static_cast<char*>(v.data) + begin * v.strides[0] * DTypeSize(v.dtype);
  out.shape[0] = n;
  return out;
}

// Columns [begin, begin + n) of a [N, K] view: rows keep their stride.
TensorView Columns(const TensorView& v, int64_t begin, int64_t n) {
  TensorView out = v;
  out.data = static_cast<char*>(v.data) + begin * v.strides[1] * DTypeSize(v.dtype);
  out.shape[1] = n;
  return out;
}

std::optional<TensorView> Rows(const std::optional<TensorView>& v, int64_t begin, int64_t n) {
  if (!v) return std::nullopt;
  return Rows(*v, begin, n);
}

}  // namespace

absl::StatusOr<TensorParallelShard> ComputeTensorParallelShard(const ModelConfig& config, int32_t rank,
                                                               int32_t size) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", size, " must be >= 1"));
  if (rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel rank ", rank, " is not in [0, ", size, ")"));
  const int64_t h = config.num_attention_heads, hkv = config.num_key_value_heads;
  auto cannot = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split the model over --tensor-parallel-size ", size, ": ", why));
  };
  if (h % size != 0) return cannot(absl::StrCat("num_attention_heads (", h, ") is not divisible by ", size));
  if (hkv % size != 0 && size % hkv != 0)
    return cannot(absl::StrCat("num_key_value_heads (", hkv, ") neither divides nor is divisible by ", size));
  if (config.intermediate_size % size != 0)
    return cannot(absl::StrCat("intermediate_size (", config.intermediate_size, ") is not divisible by ", size));
  if (config.vocab_size % size != 0)
    return cannot(absl::StrCat("vocab_size (", config.vocab_size, ") is not divisible by ", size,
                               " (the vocabulary is not padded)"));
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  s.num_heads = h / size;
  s.head_begin = rank * s.num_heads;
  if (size <= hkv) {
    s.num_kv_heads = hkv / size;
    s.kv_head_begin = rank * s.num_kv_heads;
  } else {
    // Each rank's query heads fall in one KV group (size % hkv == 0): hold that head.
    s.num_kv_heads = 1;
    s.kv_head_replication = static_cast<int32_t>(size / hkv);
    s.kv_head_begin = rank / s.kv_head_replication;
  }
  s.intermediate_size = config.intermediate_size / size;
  s.intermediate_begin = rank * s.intermediate_size;
  s.vocab_size = config.vocab_size / size;
  s.vocab_begin = rank * s.vocab_size;
  return s;
}

ModelWeights ShardModelWeights(const ModelWeights& full, const ModelConfig& config, const TensorParallelShard& s) {
  if (!s.is_sharded()) return full;
  const int64_t d = config.head_dim;
  ModelWeights out;
  out.embed_tokens = Rows(full.embed_tokens, s.vocab_begin, s.vocab_size);
  out.lm_head = Rows(full.lm_head, s.vocab_begin, s.vocab_size);
  out.norm = full.norm;
  out.layers.reserve(full.layers.size());
  for (const LayerWeights& w : full.layers) {
    LayerWeights l;
    l.input_layernorm = w.input_layernorm;
    l.post_attention_layernorm = w.post_attention_layernorm;
    l.q_proj = Rows(w.q_proj, s.head_begin * d, s.num_heads * d);
    l.k_proj = Rows(w.k_proj, s.kv_head_begin * d, s.num_kv_heads * d);
    l.v_proj = Rows(w.v_proj, s.kv_head_begin * d, s.num_kv_heads * d);
    l.q_bias = Rows(w.q_bias, s.head_begin * d, s.num_heads * d);
    l.k_bias = Rows(w.k_bias, s.kv_head_begin * d, s.num_kv_heads * d);
    l.v_bias = Rows(w.v_bias, s.kv_head_begin * d, s.num_kv_heads * d);
    l.o_proj = Columns(w.o_proj, s.head_begin * d, s.num_heads * d);
    // Added once: the all-reduce sums the ranks' partial outputs.
    if (s.rank == 0) l.o_bias = w.o_bias;
    l.gate_proj = Rows(w.gate_proj, s.intermediate_begin, s.intermediate_size);
    l.up_proj = Rows(w.up_proj, s.intermediate_begin, s.intermediate_size);
    l.down_proj = Columns(w.down_proj, s.intermediate_begin, s.intermediate_size);
    out.layers.push_back(l);
  }
  return out;
}

}  // namespace kvmesh::model
