// Conversions between kvmesh.v1 KV-cache messages (common.proto) and libs/kv / libs/core
// values: block hashes, tiers, KV events and KV dtypes.
//
// From-proto conversions check what the wire can get wrong (unspecified enums,
// negative counts) and return InvalidArgument naming the field.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "kv/kv_types.h"
#include "kvmesh/v1/common.pb.h"

namespace kvmesh::rpc {

void ToProto(const kv::BlockHash& hash, v1::BlockHash* proto);
kv::BlockHash FromProto(const v1::BlockHash& proto);

v1::Tier ToProto(kv::Tier tier);
// InvalidArgument for TIER_UNSPECIFIED or an unknown value.
absl::StatusOr<kv::Tier> FromProto(v1::Tier tier);

void ToProto(const kv::KvEvent& event, v1::KvEvent* proto);
// InvalidArgument for an unspecified kind or tier, or num_tokens < 0.
absl::StatusOr<kv::KvEvent> FromProto(const v1::KvEvent& proto);

// InvalidArgument for a dtype KV is never stored in (int32, int64, uint8, bool).
absl::StatusOr<v1::KvDtype> KvDtypeToProto(DType dtype);
// InvalidArgument for KV_DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> KvDtypeFromProto(v1::KvDtype dtype);

}  // namespace kvmesh::rpc
