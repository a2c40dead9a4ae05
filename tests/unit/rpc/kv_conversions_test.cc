#include "rpc/kv_conversions.h"

#include <gtest/gtest.h>

namespace kvmesh::rpc {
namespace {

TEST(KvConversionsTest, KvEventsRoundTripForEveryKindAndTier) {
  for (auto kind : {kv::KvEvent::Kind::kStored, kv::KvEvent::Kind::kRemoved}) {
    for (auto tier : {kv::Tier::kDevice, kv::Tier::kHost, kv::Tier::kDisk}) {
      const kv::KvEvent event{.kind = kind,
                              .block_hash = {.low = 0xfedcba9876543210ull, .high = 0x0123456789abcdefull},
                              .parent_hash = {.low = 1, .high = ~0ull},
                              .tier = tier,
                              .num_tokens = 16};
      v1::KvEvent proto;
      ToProto(event, &proto);
      v1::KvEvent parsed;
      ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
      const auto back = FromProto(parsed);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, event);
    }
  }
}

TEST(KvConversionsTest, MalformedEventsAreInvalidArgument) {
  v1::KvEvent proto;
  ToProto(kv::KvEvent{.num_tokens = 16}, &proto);
  ASSERT_TRUE(FromProto(proto).ok());
  v1::KvEvent bad = proto;
  bad.set_kind(v1::KvEvent::KIND_UNSPECIFIED);
  EXPECT_EQ(FromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = proto;
  bad.set_tier(v1::TIER_UNSPECIFIED);
  EXPECT_EQ(FromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = proto;
  bad.set_num_tokens(-1);
  EXPECT_EQ(FromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvConversionsTest, DtypesRoundTripAndNonKvDtypesAreRejected) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kFP8E4M3, DType::kInt8}) {
    const auto proto = KvDtypeToProto(dtype);
    ASSERT_TRUE(proto.ok());
    EXPECT_EQ(*KvDtypeFromProto(*proto), dtype);
  }
  EXPECT_EQ(KvDtypeToProto(DType::kInt32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvDtypeFromProto(v1::KV_DTYPE_UNSPECIFIED).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::rpc
