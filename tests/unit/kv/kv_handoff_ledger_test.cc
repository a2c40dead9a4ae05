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
  ledger.Close(a, KvHandoffLedger::LeaseEnd::kCommitted, 0);
  ledger.Close(a, KvHandoffLedger::LeaseEnd::kFailed, 0);  // already ended: nothing
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
  ledger.Close(id, KvHandoffLedger::LeaseEnd::kExpired, 0);
  ledger.Unpin("p", /*expired=*/true);
  EXPECT_EQ(ledger.StrandedBlocks(90), 0);
  EXPECT_TRUE(ledger.empty());
  EXPECT_EQ(ledger.stats().leases_expired, 1);
  EXPECT_EQ(ledger.stats().pins_expired, 1);
}

// A lease written directly by a transport quarantines its transferred blocks (not its
// locally cached prefix) when it ends uncommitted, until the writers are gone; a commit,
// or writers gone before the end, quarantines nothing.
TEST(KvHandoffLedgerTest, DirectWritesQuarantineAnUncommittedLeaseUntilTheWritersAreGone) {
  KvHandoffLedger ledger;
  const KvTransferId failed = ledger.Grant("f", Blocks({1, 2, 3}), 1, 2, 100);
  const KvTransferId committed = ledger.Grant("c", Blocks({4, 5}), 0, 2, 100);
  const KvTransferId gone_first = ledger.Grant("g", Blocks({6}), 0, 2, 100);
  const KvTransferId plain = ledger.Grant("p", Blocks({7}), 0, 2, 100);
  for (const KvTransferId id : {failed, committed, gone_first}) ledger.ExpectDirectWrites(id);
  EXPECT_TRUE(ledger.WritersGone(gone_first).empty());
  EXPECT_EQ(ledger.Close(failed, KvHandoffLedger::LeaseEnd::kFailed, 500), Blocks({2, 3}));
  EXPECT_TRUE(ledger.Close(committed, KvHandoffLedger::LeaseEnd::kCommitted, 500).empty());
  EXPECT_TRUE(ledger.Close(gone_first, KvHandoffLedger::LeaseEnd::kAborted, 500).empty());
  EXPECT_TRUE(ledger.Close(plain, KvHandoffLedger::LeaseEnd::kExpired, 500).empty());
  EXPECT_EQ(ledger.num_quarantined_blocks(), 2);
  EXPECT_EQ(ledger.num_quarantined_leases(), 1);
  EXPECT_EQ(ledger.stats().leases_quarantined, 1);
  EXPECT_EQ(ledger.StrandedBlocks(499), 0);
  EXPECT_EQ(ledger.StrandedBlocks(500), 2);  // a quarantine past the deadline its Close gave it
  EXPECT_EQ(ledger.WritersGone(failed), Blocks({2, 3}));
  EXPECT_TRUE(ledger.WritersGone(failed).empty());  // released once
  EXPECT_EQ(ledger.num_quarantined_blocks(), 0);
  EXPECT_EQ(ledger.StrandedBlocks(500), 0);
  EXPECT_TRUE(ledger.empty());
}

}  // namespace
}  // namespace kvmesh::kv
