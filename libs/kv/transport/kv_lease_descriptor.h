// KvLeaseDescriptor: what a receiver hands a sender so that the sender can write the
// receiver's leased blocks directly — the lease token, the receiver pool's KV layout and
// placement (base address, block count), the destination block ids, and the transport's
// access material (for UCX: the packed remote key and the worker address). The control
// plane carries it as opaque bytes; Encode / Decode are its only readers and writers.
//
// Wire form (little-endian): "KVLD", version u16, then the fields in declaration order
// (strings and lists as u32 length + items), then XXH64 of everything before it. Decode
// checks every length against what is left and the checksum before anything is used, so
// a truncated or altered descriptor is refused as a whole.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kv/kv_block_spec.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct KvLeaseDescriptor {
  uint64_t lease_token = 0;
  KvBlockSpec spec;                // the receiver pool's block layout
  int32_t pool_num_blocks = 0;     // blocks per layer in the receiver's pool
  uint64_t remote_base = 0;        // the receiver pool's address, in its process
  std::vector<BlockId> block_ids;  // destination blocks, in the sender's index order
  std::string remote_key;          // transport access key of the pool (UCX: packed rkey)
  std::string worker_address;      // where to reach the receiver (UCX: worker address)
  // The receiver's host and PID namespace (ucx/same_host.h: LocalHostIdentity), and its
  // pid when it offers same-host writes by cross-memory attach (ucx/cma_put.h), else 0.
  int32_t receiver_pid = 0;
  std::string host_identity;
};

// Upper bounds Decode enforces (a descriptor is a few KB).
inline constexpr int64_t kMaxLeaseBlocks = 1 << 20;
inline constexpr int64_t kMaxLeaseKeyBytes = 1 << 16;

std::string EncodeKvLeaseDescriptor(const KvLeaseDescriptor& descriptor);

// InvalidArgument, naming what is wrong, for bad magic or version, a truncated field, a
// wrong checksum, trailing bytes, a non-positive spec field, block_bytes that disagree
// with the spec, a block id outside the pool, a repeated block id, or an empty key or
// address.
absl::StatusOr<KvLeaseDescriptor> DecodeKvLeaseDescriptor(std::string_view bytes);

}  // namespace kvmesh::kv
