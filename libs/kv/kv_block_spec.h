// KvBlockSpec: the shape of one KV block of one layer, as two pools must agree on it
// before blocks move between them (prefill -> decode transfer, docs/architecture.md §3).
//
// A transfer moves whole blocks, layer by layer, byte for byte (kv/kv_layout.h: one
// block of one layer is ONE contiguous range of block_bytes). That is only meaningful
// when both sides hold the same model's KV in the same layout: same layer count, same
// per-rank KV heads and head_dim, same tokens per block and the same element type. The
// receiver publishes its spec with the lease; the sender checks it against its own
// (CheckKvBlockSpecsMatch) before sending anything.
//
// Header-only on purpose: a plain value plus two pure functions.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "kv/kv_layout.h"

namespace kvmesh::kv {

struct KvBlockSpec {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;  // per rank
  int32_t head_dim = 0;
  int32_t block_size_tokens = 0;
  DType dtype = DType::kF32;
  int64_t block_bytes = 0;  // one block of one layer, K and V

  bool operator==(const KvBlockSpec&) const = default;
};

inline KvBlockSpec KvBlockSpecOf(const KvLayout& layout) {
  return KvBlockSpec{.num_layers = layout.num_layers(),
                     .num_kv_heads = layout.num_kv_heads(),
                     .head_dim = layout.head_dim(),
                     .block_size_tokens = layout.block_size_tokens(),
                     .dtype = layout.dtype(),
                     .block_bytes = layout.BlockBytes()};
}

// OK when `sender`'s blocks can be copied byte for byte into `receiver`'s pool;
// otherwise InvalidArgument naming the first field that differs, with both values.
inline absl::Status CheckKvBlockSpecsMatch(const KvBlockSpec& sender, const KvBlockSpec& receiver) {
  auto differ = [](const char* field, auto s, auto r) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block layouts differ: ", field, " is ", s, " on the sender but ", r, " on the receiver"));
  };
  if (sender.num_layers != receiver.num_layers) return differ("num_layers", sender.num_layers, receiver.num_layers);
  if (sender.num_kv_heads != receiver.num_kv_heads) {
    return differ("num_kv_heads", sender.num_kv_heads, receiver.num_kv_heads);
  }
  if (sender.head_dim != receiver.head_dim) return differ("head_dim", sender.head_dim, receiver.head_dim);
  if (sender.block_size_tokens != receiver.block_size_tokens) {
    return differ("block_size_tokens", sender.block_size_tokens, receiver.block_size_tokens);
  }
  if (sender.dtype != receiver.dtype) {
    return differ("dtype", ToAbsl(DTypeName(sender.dtype)), ToAbsl(DTypeName(receiver.dtype)));
  }
  if (sender.block_bytes != receiver.block_bytes) {
    return differ("block_bytes", sender.block_bytes, receiver.block_bytes);
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
