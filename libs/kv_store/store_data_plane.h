// The kv-store's one-sided data plane, as both ends see it: the KV layout under which a
// store's slots and a worker's blocks are each one registered pool of a kv::KvTransport
// (UCX: libs/kv/transport/ucx), and what a KvStoreClient needs to move blocks through it.
//
// A store block is opaque bytes (every layer of one block of one TP rank), so both
// pools are described as one "layer" of byte blocks: StoreSlotLayout(block_bytes, n).
// The transport refuses a push between pools of different layouts, so the data plane
// carries blocks of exactly the store's slot stride (--block_bytes rounded up to 64);
// any other size goes over the gRPC stream.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/statusor.h"
#include "kv/kv_layout.h"
#include "kv/transport/kv_transport.h"

namespace kvmesh::kv_store {

// `num_blocks` byte blocks of `block_bytes` each, back to back, as a KvLayout (one layer,
// int8, block_bytes = 2 x head_dim). InvalidArgument for an odd or non-positive
// block_bytes or a non-positive count.
absl::StatusOr<kv::KvLayout> StoreSlotLayout(int64_t block_bytes, int32_t num_blocks);

// A client's end: its transport and the pool its blocks (a worker's host tier) live in,
// registered with that transport under StoreSlotLayout(block_bytes, num_blocks).
struct KvStoreDataPlane {
  kv::KvTransport* transport = nullptr;  // nullptr: no data plane; must outlive the client
  kv::KvPoolHandle pool;
  std::byte* base = nullptr;
  int64_t block_bytes = 0;
  int32_t num_blocks = 0;
  // A call's blocks on one store move in concurrent pieces of at most this many (0: one
  // piece), so that checking one piece overlaps moving the next (kv_store_client.h).
  int32_t max_blocks_per_transfer = 16;
  // A seam for tests: runs on every block that landed, before it is verified (they
  // corrupt one here to see it refused).
  std::function<void(std::span<std::byte>)> after_landing;

  bool enabled() const { return transport != nullptr && base != nullptr && block_bytes > 0 && num_blocks > 0; }
  // The pool block that `bytes` is exactly, or -1.
  int32_t BlockOf(std::span<const std::byte> bytes) const;
};

// Registers [base, base + block_bytes * num_blocks) with `transport` as a client's pool.
absl::StatusOr<KvStoreDataPlane> RegisterDataPlane(kv::KvTransport& transport, std::byte* base, int64_t block_bytes,
                                                   int32_t num_blocks);

}  // namespace kvmesh::kv_store
