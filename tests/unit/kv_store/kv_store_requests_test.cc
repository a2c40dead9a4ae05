// The wire side of the kv-store (kv_store_requests.h): every count, size, id and epoch
// from the wire is checked before the BlockStore sees it.
#include "kv_store_server/kv_store_requests.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "kv/checksum.h"
#include "kv_store/kv_store_wire.h"

namespace kvmesh::kv_store {
namespace {

constexpr int64_t kSlotBytes = 128;
constexpr uint64_t kEpoch = 5;

class KvStoreRequestsTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> store_ =
      BlockStore::Create({.capacity_blocks = 4, .slot_bytes = kSlotBytes, .epoch = kEpoch}).value();

  static void AddKey(google::protobuf::RepeatedPtrField<v1::KvStoreKey>* keys, uint64_t n) {
    ToProto(StoreKey{.low = n, .high = n}, keys->Add());
  }
  // A reserved key's Put message with correct bytes and checksum.
  v1::KvPutBlock ReservedBlock(uint64_t n) {
    v1::KvPutIntentRequest request;
    AddKey(request.mutable_keys(), n);
    request.set_block_bytes(kSlotBytes);
    v1::KvPutIntentResponse response;
    EXPECT_TRUE(HandlePutIntent(*store_, request, &response).ok());
    v1::KvPutBlock block;
    block.set_epoch(response.epoch());
    *block.mutable_key() = request.keys(0);
    block.set_token(response.blocks(0).token());
    block.set_data(std::string(kSlotBytes, 'k'));
    block.set_checksum(kv::Checksum({reinterpret_cast<const std::byte*>(block.data().data()), block.data().size()}));
    return block;
  }
};

TEST_F(KvStoreRequestsTest, LookupNeedsBetweenOneAndTheMaximumNumberOfKeys) {
  v1::KvLookupRequest request;
  v1::KvLookupResponse response;
  EXPECT_EQ(HandleLookup(*store_, request, &response).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i <= kMaxKeysPerRequest; ++i) AddKey(request.mutable_keys(), i);
  EXPECT_EQ(HandleLookup(*store_, request, &response).code(), absl::StatusCode::kInvalidArgument);
  request.mutable_keys()->RemoveLast();
  ASSERT_TRUE(HandleLookup(*store_, request, &response).ok());
  EXPECT_EQ(response.epoch(), kEpoch);
  EXPECT_EQ(response.num_present(), 0);
}

TEST_F(KvStoreRequestsTest, PutIntentRefusesBlockSizesOutsideTheSlot) {
  v1::KvPutIntentRequest request;
  AddKey(request.mutable_keys(), 1);
  v1::KvPutIntentResponse response;
  for (const int64_t bytes : {int64_t{0}, int64_t{-1}, kSlotBytes + 1, int64_t{1} << 62}) {
    request.set_block_bytes(bytes);
    EXPECT_EQ(HandlePutIntent(*store_, request, &response).code(), absl::StatusCode::kInvalidArgument) << bytes;
  }
  EXPECT_EQ(store_->Stats().num_intents, 0);
}

TEST_F(KvStoreRequestsTest, APutBlockIsValidatedBeforeTheStoreSeesIt) {
  v1::KvPutBlock no_key = ReservedBlock(1);
  no_key.clear_key();
  EXPECT_EQ(HandlePutBlock(*store_, no_key).code(), absl::StatusCode::kInvalidArgument);
  v1::KvPutBlock no_token = ReservedBlock(2);
  no_token.set_token(0);
  EXPECT_EQ(HandlePutBlock(*store_, no_token).code(), absl::StatusCode::kInvalidArgument);
  v1::KvPutBlock too_big = ReservedBlock(3);
  too_big.set_data(std::string(kSlotBytes + 1, 'k'));
  EXPECT_EQ(HandlePutBlock(*store_, too_big).code(), absl::StatusCode::kInvalidArgument);
  v1::KvPutBlock old_epoch = ReservedBlock(4);
  old_epoch.set_epoch(kEpoch + 1);
  EXPECT_EQ(HandlePutBlock(*store_, old_epoch).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Stats().num_blocks, 0);
  old_epoch.set_epoch(kEpoch);
  EXPECT_TRUE(HandlePutBlock(*store_, old_epoch).ok());
  // Again with other bytes: under the committed checksum it is a lie, with its own it
  // is refused as a change to an immutable block.
  v1::KvPutBlock changed = old_epoch;
  changed.set_data(std::string(kSlotBytes, 'x'));
  EXPECT_EQ(HandlePutBlock(*store_, changed).code(), absl::StatusCode::kDataLoss);
  changed.set_checksum(kv::Checksum({reinterpret_cast<const std::byte*>(changed.data().data()), kSlotBytes}));
  EXPECT_EQ(HandlePutBlock(*store_, changed).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(HandlePutBlock(*store_, old_epoch).ok());  // the same bytes again: a no-op
}

TEST_F(KvStoreRequestsTest, GetAndReleaseCheckTheirLeaseAndEpoch) {
  v1::KvGetRequest get;
  EXPECT_EQ(CheckGetRequest(*store_, get).code(), absl::StatusCode::kInvalidArgument);  // no keys
  AddKey(get.mutable_keys(), 1);
  EXPECT_TRUE(CheckGetRequest(*store_, get).ok());
  get.set_lease_id(3);
  EXPECT_EQ(CheckGetRequest(*store_, get).code(), absl::StatusCode::kInvalidArgument);  // lease without epoch
  get.set_epoch(kEpoch + 1);
  EXPECT_EQ(CheckGetRequest(*store_, get).code(), absl::StatusCode::kFailedPrecondition);
  get.set_epoch(kEpoch);
  EXPECT_TRUE(CheckGetRequest(*store_, get).ok());
  get.set_lease_id(0);
  get.set_release_lease(true);
  EXPECT_EQ(CheckGetRequest(*store_, get).code(), absl::StatusCode::kInvalidArgument);

  v1::KvReleaseRequest release;
  v1::KvReleaseResponse released;
  release.set_epoch(kEpoch);
  EXPECT_EQ(HandleRelease(*store_, release, &released).code(), absl::StatusCode::kInvalidArgument);
  release.set_lease_id(9);
  release.set_epoch(kEpoch + 1);
  EXPECT_EQ(HandleRelease(*store_, release, &released).code(), absl::StatusCode::kFailedPrecondition);
  release.set_epoch(kEpoch);
  ASSERT_TRUE(HandleRelease(*store_, release, &released).ok());
  EXPECT_FALSE(released.released());
}

TEST_F(KvStoreRequestsTest, AReadBlockCarriesItsBytesChecksumAndEpoch) {
  const v1::KvPutBlock put = ReservedBlock(1);
  ASSERT_TRUE(HandlePutBlock(*store_, put).ok());
  v1::KvGetBlock block;
  ASSERT_TRUE(ReadGetBlock(*store_, put.key(), &block).ok());
  EXPECT_EQ(block.epoch(), kEpoch);
  EXPECT_EQ(block.data(), put.data());
  EXPECT_EQ(block.checksum(), put.checksum());
  v1::KvStoreKey missing;
  missing.set_low(99);
  EXPECT_EQ(ReadGetBlock(*store_, missing, &block).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvmesh::kv_store
