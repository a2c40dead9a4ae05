#include "cluster/in_flight_prefixes.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "kv/block_hash.h"

namespace kvmesh::cluster {
namespace {

std::vector<kv::BlockHash> Hashes(int32_t num_blocks, int32_t first_token = 1) {
  std::vector<int32_t> tokens(num_blocks * 4);
  std::iota(tokens.begin(), tokens.end(), first_token);
  return kv::HashFullBlocks(tokens, 4, 0);
}

kv::KvEvent Event(kv::KvEvent::Kind kind, const kv::BlockHash& hash) {
  return {.kind = kind, .block_hash = hash, .num_tokens = 4};
}

const absl::Time kNow = absl::FromUnixSeconds(1000);

TEST(InFlightPrefixesTest, ANotedPromptIsALeadingRunUntilItsDeadline) {
  InFlightPrefixes in_flight;
  const auto hashes = Hashes(6);
  in_flight.Note("a", hashes, kNow + absl::Seconds(10));
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 0, kNow), 6);
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 2, kNow), 4);
  EXPECT_EQ(in_flight.LeadingRun("b", hashes, 0, kNow), 0);  // another worker
  EXPECT_EQ(in_flight.LeadingRun("a", Hashes(6, 500), 0, kNow), 0);  // another prompt
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 0, kNow + absl::Seconds(10)), 0);  // expired
}

TEST(InFlightPrefixesTest, APromptSharingOnlyTheFirstBlocksMatchesThoseOnly) {
  InFlightPrefixes in_flight;
  const auto system = Hashes(8);
  in_flight.Note("a", system, kNow + absl::Seconds(10));
  // Same first 5 blocks, then other tokens: chained hashes differ from block 5 on.
  std::vector<int32_t> tokens(8 * 4);
  std::iota(tokens.begin(), tokens.end(), 1);
  for (size_t i = 5 * 4; i < tokens.size(); ++i) tokens[i] += 10'000;
  EXPECT_EQ(in_flight.LeadingRun("a", kv::HashFullBlocks(tokens, 4, 0), 0, kNow), 5);
}

TEST(InFlightPrefixesTest, ReportedBlocksStopBeingInFlight) {
  InFlightPrefixes in_flight;
  const auto hashes = Hashes(4);
  in_flight.Note("a", hashes, kNow + absl::Seconds(10));
  const std::vector<kv::KvEvent> events = {Event(kv::KvEvent::Kind::kStored, hashes[0]),
                                           Event(kv::KvEvent::Kind::kRemoved, hashes[1])};
  in_flight.Apply("a", events, kNow);
  EXPECT_EQ(in_flight.num_entries(), 2);
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 0, kNow), 0);
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 2, kNow), 2);
  // Events of another worker change nothing here.
  in_flight.Apply("b", std::vector<kv::KvEvent>{Event(kv::KvEvent::Kind::kStored, hashes[2])}, kNow);
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 2, kNow), 2);
}

TEST(InFlightPrefixesTest, ApplyDropsExpiredEntriesAndRemoveWorkerForgetsAll) {
  InFlightPrefixes in_flight;
  in_flight.Note("a", Hashes(3), kNow + absl::Seconds(1));
  in_flight.Note("a", Hashes(2, 700), kNow + absl::Seconds(20));
  in_flight.Note("b", Hashes(2), kNow + absl::Seconds(20));
  EXPECT_EQ(in_flight.num_entries(), 7);
  in_flight.Apply("a", {}, kNow + absl::Seconds(2));
  EXPECT_EQ(in_flight.num_entries(), 4);
  in_flight.RemoveWorker("b");
  EXPECT_EQ(in_flight.num_entries(), 2);
  EXPECT_EQ(in_flight.LeadingRun("a", Hashes(2, 700), 0, kNow + absl::Seconds(2)), 2);
}

TEST(InFlightPrefixesTest, NotingAgainKeepsTheLaterDeadline) {
  InFlightPrefixes in_flight;
  const auto hashes = Hashes(2);
  in_flight.Note("a", hashes, kNow + absl::Seconds(10));
  in_flight.Note("a", hashes, kNow + absl::Seconds(5));
  EXPECT_EQ(in_flight.LeadingRun("a", hashes, 0, kNow + absl::Seconds(7)), 2);
  in_flight.Note("a", {}, kNow);  // nothing to note
  EXPECT_EQ(in_flight.num_entries(), 2);
}

}  // namespace
}  // namespace kvmesh::cluster
