// A SmolLM2-135M KV block as the kv-store holds it, shared by the store's integration
// tests and its bandwidth bench: one TP rank's 16-token block, every layer.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kv/kv_block_spec.h"

namespace kvmesh::kv_store {

// 30 layers x (K, V) x 3 KV heads x 16 tokens x head_dim 64 x bf16: 12 KiB a layer.
inline const kv::KvBlockSpec kSmolLm2Block{.num_layers = 30,
                                           .num_kv_heads = 3,
                                           .head_dim = 64,
                                           .block_size_tokens = 16,
                                           .dtype = DType::kBF16,
                                           .block_bytes = 12288};
inline constexpr int64_t kSmolLm2BlockBytes = 30 * 12288;  // every layer: 360 KiB (368640 bytes)

}  // namespace kvmesh::kv_store
