#include "kv/kv_handoff_ledger.h"

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

std::vector<BlockId> Blocks(std::initializer_list<int32_t> ids) {
  std::vector<BlockId> v;
  for (int32_t id : ids) v.push_back(BlockId{id});
  return v;
}

TEST(KvHandoffLedgerTest, LeaseEndsExactlyOnceAndIdsAreNeverReused) {
  KvHandoffLedger ledger;
  const KvTransferId a = ledger.Grant("r1", Blocks({4, 5, 6}), 1, 2, 100);
  const KvTransferId b = ledger.Grant("r2", Blocks({7}), 0, 2, 100);
  EXPECT_NE(a, b);
  ASSERT_NE(ledger.LeaseOf("r1"), nullptr);
  ledger.Close(a, KvHandoffLedger::LeaseEnd::kCommitted);
  ledger.Close(a, KvHandoffLedger::LeaseEnd::kFailed);  // already ended: nothing
  EXPECT_EQ(ledger.LeaseOf("r1"), nullptr);
  EXPECT_EQ(ledger.Find(a, 0, "test").status().code(), absl::StatusCode::kFailedPrecondition);
  const KvTransferId c = ledger.Grant("r1", Blocks({4}), 0, 2, 100);
  EXPECT_GT(c.value, b.value);
  EXPECT_EQ(ledger.stats().leases_granted, 3);
  EXPECT_EQ(ledger.stats().leases_committed, 1);
  EXPECT_EQ(ledger.stats().leases_failed, 0);
}

TEST(KvHandoffLedgerTest, ImportTargetRefusesCachedAndOutOfRangeBlocks) {
  KvHandoffLedger ledger;
  const KvTransferId id = ledger.Grant("r", Blocks({10, 11, 12}), 1, 2, 100);
  KvLease* lease = ledger.Find(id, 0, "test").value();
  EXPECT_EQ(ledger.ImportTarget(*lease, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);  // cached
  EXPECT_EQ(ledger.ImportTarget(*lease, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);  // layer
  EXPECT_EQ(ledger.ImportTarget(*lease, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);  // block
  EXPECT_EQ(ledger.ImportTarget(*lease, 1, 2).value(), BlockId{12});
  ledger.RecordImport(*lease, 1, 2);
  ledger.RecordImport(*lease, 1, 2);  // twice counts once
  EXPECT_EQ(lease->num_imported, 1);
  EXPECT_EQ(lease->num_expected(), 4);
}

TEST(KvHandoffLedgerTest, ExpiredEntriesAreRefusedAndCountAsStranded) {
  KvHandoffLedger ledger;
  const KvTransferId id = ledger.Grant("r", Blocks({1, 2}), 0, 1, 50);
  ledger.Pin("p", Blocks({3, 4, 5}), 80);
  EXPECT_EQ(ledger.StrandedBlocks(10), 0);
  EXPECT_EQ(ledger.Find(id, 50, "test").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger.StrandedBlocks(60), 2);
  EXPECT_EQ(ledger.ExpiredLeases(60), std::vector<KvTransferId>{id});
  EXPECT_EQ(ledger.StrandedBlocks(90), 5);
  EXPECT_EQ(ledger.ExpiredPins(90), std::vector<std::string>{"p"});
  ledger.Close(id, KvHandoffLedger::LeaseEnd::kExpired);
  ledger.Unpin("p", /*expired=*/true);
  EXPECT_EQ(ledger.StrandedBlocks(90), 0);
  EXPECT_TRUE(ledger.empty());
  EXPECT_EQ(ledger.stats().leases_expired, 1);
  EXPECT_EQ(ledger.stats().pins_expired, 1);
}

}  // namespace
}  // namespace kvmesh::kv
