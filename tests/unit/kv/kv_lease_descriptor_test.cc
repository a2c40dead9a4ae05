#include "kv/transport/kv_lease_descriptor.h"

#include <gtest/gtest.h>

#include <string>

namespace kvmesh::kv {
namespace {

KvLeaseDescriptor Sample() {
  KvLeaseDescriptor d;
  d.lease_token = 0x1234'5678'9abc'def0ULL;
  d.spec = KvBlockSpec{.num_layers = 2, .num_kv_heads = 3, .head_dim = 64, .block_size_tokens = 16,
                       .dtype = DType::kBF16, .block_bytes = 2 * 3 * 16 * 64 * 2};
  d.pool_num_blocks = 100;
  d.remote_base = 0x7f00'0000'1000ULL;
  d.block_ids = {BlockId{3}, BlockId{4}, BlockId{99}};
  d.remote_key = std::string("\x01\x02\x00rkey", 7);
  d.worker_address = "address-bytes";
  d.receiver_pid = 4242;
  d.host_identity = "boot-id/4026531836";
  return d;
}

TEST(KvLeaseDescriptorTest, RoundTripsEveryField) {
  const KvLeaseDescriptor d = Sample();
  auto back = DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->lease_token, d.lease_token);
  EXPECT_EQ(back->spec, d.spec);
  EXPECT_EQ(back->pool_num_blocks, d.pool_num_blocks);
  EXPECT_EQ(back->remote_base, d.remote_base);
  EXPECT_EQ(back->block_ids, d.block_ids);
  EXPECT_EQ(back->remote_key, d.remote_key);
  EXPECT_EQ(back->worker_address, d.worker_address);
  EXPECT_EQ(back->receiver_pid, d.receiver_pid);
  EXPECT_EQ(back->host_identity, d.host_identity);
}

TEST(KvLeaseDescriptorTest, RefusesEveryTruncation) {
  const std::string bytes = EncodeKvLeaseDescriptor(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeKvLeaseDescriptor(bytes.substr(0, n)).status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
}

TEST(KvLeaseDescriptorTest, RefusesAnyFlippedByte) {
  const std::string bytes = EncodeKvLeaseDescriptor(Sample());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_EQ(DecodeKvLeaseDescriptor(bad).status().code(), absl::StatusCode::kInvalidArgument) << i;
  }
}

TEST(KvLeaseDescriptorTest, RefusesBlockOutsideThePool) {
  KvLeaseDescriptor d = Sample();
  d.block_ids.push_back(BlockId{100});
  const auto s = DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the pool"), std::string::npos) << s;
}

TEST(KvLeaseDescriptorTest, RefusesRepeatedBlock) {
  KvLeaseDescriptor d = Sample();
  d.block_ids.push_back(BlockId{3});
  EXPECT_EQ(DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvLeaseDescriptorTest, RefusesBlockBytesThatDisagreeWithTheLayout) {
  KvLeaseDescriptor d = Sample();
  d.spec.block_bytes += 2;
  EXPECT_EQ(DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvLeaseDescriptorTest, RefusesEmptyKeyOrAddress) {
  KvLeaseDescriptor d = Sample();
  d.remote_key.clear();
  EXPECT_EQ(DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d)).status().code(), absl::StatusCode::kInvalidArgument);
  d = Sample();
  d.worker_address.clear();
  EXPECT_EQ(DecodeKvLeaseDescriptor(EncodeKvLeaseDescriptor(d)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::kv
