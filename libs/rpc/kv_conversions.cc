#include "rpc/kv_conversions.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::rpc {

void ToProto(const kv::BlockHash& hash, v1::BlockHash* proto) {
  proto->set_low(hash.low);
  proto->set_high(hash.high);
}

kv::BlockHash FromProto(const v1::BlockHash& proto) { return kv::BlockHash{.low = proto.low(), .high = proto.high()}; }

v1::Tier ToProto(kv::Tier tier) {
  switch (tier) {
    case kv::Tier::kDevice: return v1::TIER_DEVICE;
    case kv::Tier::kHost: return v1::TIER_HOST;
    case kv::Tier::kDisk: return v1::TIER_DISK;
    case kv::Tier::kStore: return v1::TIER_STORE;
  }
  return v1::TIER_UNSPECIFIED;
}

absl::StatusOr<kv::Tier> FromProto(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE: return kv::Tier::kDevice;
    case v1::TIER_HOST: return kv::Tier::kHost;
    case v1::TIER_DISK: return kv::Tier::kDisk;
    case v1::TIER_STORE: return kv::Tier::kStore;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("tier: unspecified or unknown (", static_cast<int>(tier), ")"));
}

void ToProto(const kv::KvEvent& event, v1::KvEvent* proto) {
  proto->set_kind(event.kind == kv::KvEvent::Kind::kStored ? v1::KvEvent::KIND_STORED : v1::KvEvent::KIND_REMOVED);
  ToProto(event.block_hash, proto->mutable_block_hash());
  ToProto(event.parent_hash, proto->mutable_parent_hash());
  proto->set_tier(ToProto(event.tier));
  proto->set_num_tokens(event.num_tokens);
}

absl::StatusOr<kv::KvEvent> FromProto(const v1::KvEvent& proto) {
  kv::KvEvent event;
  switch (proto.kind()) {
    case v1::KvEvent::KIND_STORED: event.kind = kv::KvEvent::Kind::kStored; break;
    case v1::KvEvent::KIND_REMOVED: event.kind = kv::KvEvent::Kind::kRemoved; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kv_event.kind: unspecified or unknown (", static_cast<int>(proto.kind()), ")"));
  }
  auto tier = FromProto(proto.tier());
  if (!tier.ok()) return absl::InvalidArgumentError(absl::StrCat("kv_event.", tier.status().message()));
  event.tier = *tier;
  if (proto.num_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_event.num_tokens: negative (", proto.num_tokens(), ")"));
  }
  event.block_hash = FromProto(proto.block_hash());
  event.parent_hash = FromProto(proto.parent_hash());
  event.num_tokens = proto.num_tokens();
  return event;
}

absl::StatusOr<v1::KvDtype> KvDtypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::KV_DTYPE_F32;
    case DType::kBF16: return v1::KV_DTYPE_BF16;
    case DType::kF16: return v1::KV_DTYPE_F16;
    case DType::kFP8E4M3: return v1::KV_DTYPE_FP8_E4M3;
    case DType::kInt8: return v1::KV_DTYPE_INT8;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("kv dtype: ", ToAbsl(DTypeName(dtype)), " is not a KV cache dtype"));
}

absl::StatusOr<DType> KvDtypeFromProto(v1::KvDtype dtype) {
  switch (dtype) {
    case v1::KV_DTYPE_F32: return DType::kF32;
    case v1::KV_DTYPE_BF16: return DType::kBF16;
    case v1::KV_DTYPE_F16: return DType::kF16;
    case v1::KV_DTYPE_FP8_E4M3: return DType::kFP8E4M3;
    case v1::KV_DTYPE_INT8: return DType::kInt8;
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kv_cache_spec.dtype: unspecified or unknown (", static_cast<int>(dtype), ")"));
}

}  // namespace kvmesh::rpc
