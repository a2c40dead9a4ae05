// What ucx_kv_transport_test and its peer process (ucx_kv_peer.cc) agree on: the pool
// both sides register and the byte the peer sender fills its blocks with.
#pragma once

#include <cstddef>

#include "kv/kv_layout.h"

namespace kvmesh::kv {

inline KvLayoutOptions PeerPoolShape() {
  return KvLayoutOptions{.num_layers = 4, .num_kv_heads = 3, .head_dim = 64, .block_size_tokens = 16,
                         .dtype = DType::kBF16, .num_blocks = 64};
}

inline constexpr int kPeerSenderByte = 0xA5;

}  // namespace kvmesh::kv
