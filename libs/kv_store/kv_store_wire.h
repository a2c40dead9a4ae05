// kvmesh.v1.KvStore messages (proto/kvmesh/v1/kv_store.proto) <-> kv_store values, and
// the limits both ends of the wire hold requests to. Shared by KvStoreClient and the
// service (libs/kv_store_server); block_store.h and store_key.h stay protobuf-free.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "kv_store/block_store.h"
#include "kv_store/store_key.h"
#include "kvmesh/v1/kv_store.pb.h"

namespace kvmesh::kv_store {

// The most keys one Lookup, PutIntent or Get may name (a 1M-token prompt in 16-token
// blocks); more is InvalidArgument.
inline constexpr int kMaxKeysPerRequest = 65536;

// The largest ucx_lease_descriptor a request may carry: a lease over kMaxKeysPerRequest
// blocks (4 bytes each) with its key and address (kv/transport/kv_lease_descriptor.h).
inline constexpr int64_t kMaxLeaseDescriptorBytes = (int64_t{4} * kMaxKeysPerRequest) + (int64_t{1} << 18);

inline void ToProto(const StoreKey& key, v1::KvStoreKey* proto) {
  proto->set_low(key.low);
  proto->set_high(key.high);
}
inline StoreKey FromProto(const v1::KvStoreKey& proto) { return StoreKey{.low = proto.low(), .high = proto.high()}; }

v1::KvPutIntentResponse::Outcome ToProto(IntentOutcome outcome);

// InvalidArgument naming `field` unless 1 <= n <= kMaxKeysPerRequest.
absl::Status CheckKeyCount(int n, std::string_view field);

}  // namespace kvmesh::kv_store
