#include "kv/disk_kv_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>

#include "gtest/gtest.h"

namespace kvmesh::kv {
namespace {

namespace fs = std::filesystem;

// Payloads are a function of their key, so a test (or a restarted process) knows what
// every block must hold.
std::vector<std::byte> MakePayload(uint64_t key, int64_t bytes) {
  std::vector<std::byte> out(static_cast<size_t>(bytes));
  uint64_t x = key * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return out;
}
BlockHash HashOf(uint64_t key) { return BlockHash{.low = key + 1, .high = key * 31 + 7}; }
BlockHash ParentOf(uint64_t key) { return key == 0 ? kRootBlockHash : HashOf(key - 1); }
// The tier's checksum computed independently of kv::Checksum (libxxhash's own XXH3, not
// its runtime dispatch): a record verifies only if the two agree.
uint64_t Checksum(std::span<const std::byte> p) { return XXH3_64bits(p.data(), p.size()); }

std::vector<std::string>& CreatedDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// A fresh directory per test under the test temp dir, removed when the test ends.
std::string FreshDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("disktier-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  CreatedDirs().push_back(dir.string());
  return dir.string();
}

class DiskKvTierTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    for (const std::string& dir : CreatedDirs()) fs::remove_all(dir, ec);
    CreatedDirs().clear();
  }
};

// 2 layers x 6 KiB + a bit: not a multiple of 4 KiB, so the staging path runs too.
DiskKvTierOptions SmallOptions(const std::string& dir, int64_t capacity_records, int32_t layers = 2,
                               int64_t block_bytes = 6 * 1024 + 40) {
  DiskKvTierOptions o;
  o.directory = dir;
  o.num_layers = layers;
  o.block_bytes = block_bytes;
  o.record_payload_bytes = layers * block_bytes;
  o.capacity_bytes = capacity_records * DiskRecordBytes(o.record_payload_bytes);
  o.salt = 0x5a17;
  o.dtype = 1;
  o.queue_depth = 8;
  return o;
}

// Writes keys [first, first + n), waiting for each batch; returns their payloads.
std::map<uint64_t, std::vector<std::byte>> WriteAll(DiskKvTier& tier, uint64_t first, int n, int64_t bytes) {
  std::map<uint64_t, std::vector<std::byte>> payloads;
  for (int i = 0; i < n; ++i) {
    const uint64_t key = first + static_cast<uint64_t>(i);
    auto& p = payloads[key] = MakePayload(key, bytes);
    auto ticket = tier.StartSave(HashOf(key), ParentOf(key), p, Checksum(p));
    if (ticket.status().code() == absl::StatusCode::kResourceExhausted) {  // queue full: wait, retry
      for (const auto& c : tier.Drain()) EXPECT_TRUE(c.status.ok()) << c.status;
      ticket = tier.StartSave(HashOf(key), ParentOf(key), p, Checksum(p));
    }
    EXPECT_TRUE(ticket.ok()) << ticket.status();
  }
  for (const auto& c : tier.Drain()) EXPECT_TRUE(c.status.ok()) << c.status;
  return payloads;
}

// Reads `key` and waits: its completion status, with `out` filled.
absl::Status ReadOne(DiskKvTier& tier, uint64_t key, std::vector<std::byte>* out, int64_t bytes) {
  out->assign(static_cast<size_t>(bytes), std::byte{0});
  auto ticket = tier.StartLoad(HashOf(key), *out);
  if (!ticket.ok()) return ticket.status();
  absl::Status status = absl::InternalError("no completion");
  for (const auto& c : tier.Drain()) {
    if (c.ticket == *ticket) status = c.status;
  }
  return status;
}

void CorruptByte(const std::string& path, int64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, offset), 1);
  b ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &b, 1, offset), 1);
  ::close(fd);
}

TEST_F(DiskKvTierTest, RoundTripIsBitExactAlignedAndUnaligned) {
  for (int64_t block_bytes : {int64_t{8192}, int64_t{6 * 1024 + 40}}) {
    const std::string dir = FreshDir("roundtrip" + std::to_string(block_bytes));
    auto options = SmallOptions(dir, 16, 2, block_bytes);
    auto tier = DiskKvTier::Create(options).value();
    auto payloads = WriteAll(*tier, 0, 10, options.record_payload_bytes);
    EXPECT_EQ(tier->num_records(), 10);
    EXPECT_EQ(tier->stats().blocks_offloaded, 10);
    for (const auto& [key, p] : payloads) {
      std::vector<std::byte> got;
      ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok());
      EXPECT_EQ(got, p) << key;
    }
    // An unaligned destination goes through staging and is exact too.
    std::vector<std::byte> buf(static_cast<size_t>(options.record_payload_bytes) + 1);
    std::span<std::byte> dst(buf.data() + 1, static_cast<size_t>(options.record_payload_bytes));
    ASSERT_TRUE(tier->StartLoad(HashOf(3), dst).ok());
    auto done = tier->Drain();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].status.ok());
    EXPECT_EQ(done[0].bytes, options.record_payload_bytes);
    EXPECT_TRUE(std::equal(dst.begin(), dst.end(), payloads[3].begin()));
    EXPECT_EQ(tier->stats().blocks_onboarded, 11);
    EXPECT_GT(tier->stats().read_bytes_per_second, 0);
    EXPECT_GT(tier->stats().write_bytes_per_second, 0);
    // One kStored per write, in completion order (not necessarily submission order).
    auto events = tier->DrainEvents();
    ASSERT_EQ(events.size(), 10u);
    std::map<uint64_t, KvEvent> by_key;
    for (const KvEvent& e : events) by_key[e.block_hash.low - 1] = e;
    ASSERT_EQ(by_key.size(), 10u);
    for (const auto& [key, e] : by_key) {
      EXPECT_EQ(e.kind, KvEvent::Kind::kStored);
      EXPECT_EQ(e.tier, Tier::kDisk);
      EXPECT_EQ(e.num_tokens, kDefaultBlockSizeTokens);
      EXPECT_EQ(e.block_hash, HashOf(key));
      EXPECT_EQ(e.parent_hash, ParentOf(key));
    }
    EXPECT_TRUE(tier->CheckInvariants().ok());
  }
}

TEST_F(DiskKvTierTest, LookupCountsQueriesAndHits) {
  auto options = SmallOptions(FreshDir("lookup"), 4);
  auto tier = DiskKvTier::Create(options).value();
  WriteAll(*tier, 0, 1, options.record_payload_bytes);
  EXPECT_TRUE(tier->Lookup(HashOf(0)));
  EXPECT_FALSE(tier->Lookup(HashOf(1)));
  EXPECT_TRUE(tier->Contains(HashOf(0)));
  EXPECT_EQ(tier->stats().queries, 2);
  EXPECT_EQ(tier->stats().hits, 1);
}

TEST_F(DiskKvTierTest, RefusesDuplicatesWrongSizesMissesAndAFullQueue) {
  auto options = SmallOptions(FreshDir("refusals"), 32);
  options.queue_depth = 4;  // writes may hold 2 of it
  auto tier = DiskKvTier::Create(options).value();
  auto p0 = MakePayload(0, options.record_payload_bytes);
  auto p1 = MakePayload(1, options.record_payload_bytes);
  auto p2 = MakePayload(2, options.record_payload_bytes);
  ASSERT_TRUE(tier->StartSave(HashOf(0), kRootBlockHash, p0, Checksum(p0)).ok());
  // Being written counts as held for writes, not for lookups.
  EXPECT_EQ(tier->StartSave(HashOf(0), kRootBlockHash, p0, Checksum(p0)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(tier->Contains(HashOf(0)));
  std::vector<std::byte> small(10);
  EXPECT_EQ(tier->StartSave(HashOf(9), kRootBlockHash, small, 0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tier->StartSave(HashOf(1), HashOf(0), p1, Checksum(p1)).ok());
  EXPECT_EQ(tier->num_in_flight(), 2);
  EXPECT_EQ(tier->StartSave(HashOf(2), HashOf(1), p2, Checksum(p2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(tier->CheckInvariants().ok());
  tier->Drain();
  EXPECT_EQ(tier->num_in_flight(), 0);
  std::vector<std::byte> dst(static_cast<size_t>(options.record_payload_bytes));
  EXPECT_EQ(tier->StartLoad(HashOf(7), dst).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier->StartLoad(HashOf(0), small).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST_F(DiskKvTierTest, AFullWriteQueueNeverRefusesARead) {
  auto options = SmallOptions(FreshDir("readroom"), 64);
  options.queue_depth = 8;
  auto tier = DiskKvTier::Create(options).value();
  auto held = WriteAll(*tier, 0, 1, options.record_payload_bytes);
  // Writes until the tier refuses one: the write-through traffic of a busy worker.
  std::vector<std::vector<std::byte>> payloads;
  for (uint64_t key = 100; key < 164; ++key) {
    payloads.push_back(MakePayload(key, options.record_payload_bytes));
    auto ticket = tier->StartSave(HashOf(key), ParentOf(key), payloads.back(), Checksum(payloads.back()));
    if (!ticket.ok()) {
      EXPECT_EQ(ticket.status().code(), absl::StatusCode::kResourceExhausted) << ticket.status();
      break;
    }
  }
  EXPECT_LE(tier->num_in_flight(), MaxWritesInFlight(options.queue_depth)) << "writes hold at most half the queue";
  EXPECT_FALSE(tier->CanStartSave());
  EXPECT_TRUE(tier->CanStartLoad());
  // A request's prefix hit on disk still gets its read (it would be recomputed otherwise).
  std::vector<std::byte> dst(static_cast<size_t>(options.record_payload_bytes));
  auto read = tier->StartLoad(HashOf(0), dst);
  ASSERT_TRUE(read.ok()) << read.status();
  bool read_done = false;
  for (const auto& c : tier->Drain()) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    if (c.ticket == *read) read_done = true;
  }
  EXPECT_TRUE(read_done);
  EXPECT_EQ(dst, held[0]);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST_F(DiskKvTierTest, RestartFindsEveryBlockInWriteOrder) {
  const std::string dir = FreshDir("restart");
  auto options = SmallOptions(dir, 8);
  std::map<uint64_t, std::vector<std::byte>> payloads;
  {
    auto tier = DiskKvTier::Create(options).value();
    payloads = WriteAll(*tier, 0, 6, options.record_payload_bytes);
  }
  auto tier = DiskKvTier::Create(options).value();
  EXPECT_EQ(tier->num_records(), 6);
  EXPECT_EQ(tier->stats().skipped_records, 0);
  auto events = tier->DrainEvents();
  ASSERT_EQ(events.size(), 6u);  // the restarted tier re-announces what it holds
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].kind, KvEvent::Kind::kStored);
    EXPECT_EQ(events[i].block_hash, HashOf(i));
    EXPECT_EQ(events[i].parent_hash, ParentOf(i));
  }
  for (const auto& [key, p] : payloads) {
    std::vector<std::byte> got;
    ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok()) << key;
    EXPECT_EQ(got, p);
  }
  // Reads reorder the LRU (all read in key order); three more writes evict 0 and 1 and
  // reuse their slots, and a second restart sees the result.
  WriteAll(*tier, 100, 4, options.record_payload_bytes);
  EXPECT_FALSE(tier->Contains(HashOf(0)));
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  EXPECT_TRUE(tier->Contains(HashOf(2)));
  tier.reset();
  tier = DiskKvTier::Create(options).value();
  EXPECT_EQ(tier->num_records(), 8);
  EXPECT_FALSE(tier->Contains(HashOf(0)));  // its slot was overwritten
  for (uint64_t key : {2, 3, 4, 5, 100, 101, 102, 103}) {
    std::vector<std::byte> got;
    ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok()) << key;
    EXPECT_EQ(got, MakePayload(key, options.record_payload_bytes));
  }
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST_F(DiskKvTierTest, CorruptedPayloadByteIsDataLossDroppedAndCounted) {
  const std::string dir = FreshDir("corrupt-payload");
  auto options = SmallOptions(dir, 8);
  auto tier = DiskKvTier::Create(options).value();
  WriteAll(*tier, 0, 3, options.record_payload_bytes);
  tier->DrainEvents();
  const auto loc = tier->LocationOf(HashOf(1)).value();
  CorruptByte(loc.path, loc.offset + kDiskRecordAlignment + 1234);
  std::vector<std::byte> got;
  EXPECT_EQ(ReadOne(*tier, 1, &got, options.record_payload_bytes).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().checksum_failures, 1);
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  auto events = tier->DrainEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block_hash, HashOf(1));
  EXPECT_EQ(ReadOne(*tier, 1, &got, options.record_payload_bytes).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ReadOne(*tier, 2, &got, options.record_payload_bytes).ok());
  EXPECT_TRUE(tier->CheckInvariants().ok());
  // The dropped record's header was zeroed: a restart does not bring it back.
  tier->Drain();
  tier.reset();
  tier = DiskKvTier::Create(options).value();
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  EXPECT_TRUE(tier->Contains(HashOf(0)));
  EXPECT_EQ(tier->num_records(), 2);
}

TEST_F(DiskKvTierTest, CorruptHeaderAndTruncatedFileAreSkippedAndCounted) {
  const std::string dir = FreshDir("corrupt-header");
  auto options = SmallOptions(dir, 8);
  DiskRecordLocation header_of_1, last;
  {
    auto tier = DiskKvTier::Create(options).value();
    WriteAll(*tier, 0, 4, options.record_payload_bytes);
    header_of_1 = tier->LocationOf(HashOf(1)).value();
    last = tier->LocationOf(HashOf(3)).value();
  }
  CorruptByte(header_of_1.path, header_of_1.offset + 40);  // inside the parent hash
  // Cut the last record's payload short.
  ASSERT_EQ(::truncate(last.path.c_str(), last.offset + kDiskRecordAlignment + 100), 0);
  auto tier = DiskKvTier::Create(options).value();
  EXPECT_EQ(tier->stats().skipped_records, 2);
  EXPECT_EQ(tier->num_records(), 2);
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  EXPECT_FALSE(tier->Contains(HashOf(3)));
  std::vector<std::byte> got;
  for (uint64_t key : {0, 2}) {
    ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok());
    EXPECT_EQ(got, MakePayload(key, options.record_payload_bytes));
  }
  // The skipped slots are reused by later writes.
  WriteAll(*tier, 10, 6, options.record_payload_bytes);
  EXPECT_EQ(tier->num_records(), 8);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST_F(DiskKvTierTest, RecordsOfAnotherSaltOrLayoutAreForeign) {
  const std::string dir = FreshDir("foreign");
  auto options = SmallOptions(dir, 8);
  {
    auto tier = DiskKvTier::Create(options).value();
    WriteAll(*tier, 0, 3, options.record_payload_bytes);
  }
  auto other_salt = options;
  other_salt.salt ^= 1;
  {
    auto tier = DiskKvTier::Create(other_salt).value();
    EXPECT_EQ(tier->num_records(), 0);
    EXPECT_EQ(tier->stats().skipped_records, 3);
    EXPECT_TRUE(tier->DrainEvents().empty());
  }
  auto other_dtype = options;
  other_dtype.dtype = 0;
  {
    auto tier = DiskKvTier::Create(other_dtype).value();
    EXPECT_EQ(tier->num_records(), 0);
    EXPECT_EQ(tier->stats().skipped_records, 3);
  }
  // Nothing was overwritten: the right model still finds them.
  auto tier = DiskKvTier::Create(options).value();
  EXPECT_EQ(tier->num_records(), 3);
}

TEST_F(DiskKvTierTest, CapacityEvictionIsLeastRecentlyUsed) {
  auto options = SmallOptions(FreshDir("lru"), 4);
  auto tier = DiskKvTier::Create(options).value();
  EXPECT_EQ(tier->capacity_records(), 4);
  // One at a time: writes enter the LRU as they complete, in any order.
  for (uint64_t key = 0; key < 4; ++key) WriteAll(*tier, key, 1, options.record_payload_bytes);  // 0 1 2 3
  std::vector<std::byte> got;
  ASSERT_TRUE(ReadOne(*tier, 0, &got, options.record_payload_bytes).ok());  // 1 2 3 0
  tier->DrainEvents();
  WriteAll(*tier, 4, 1, options.record_payload_bytes);  // evicts 1
  EXPECT_FALSE(tier->Contains(HashOf(1)));
  for (uint64_t key : {0, 2, 3, 4}) EXPECT_TRUE(tier->Contains(HashOf(key))) << key;
  EXPECT_EQ(tier->stats().evictions, 1);
  auto events = tier->DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block_hash, HashOf(1));
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(tier->num_records(), 4);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

TEST_F(DiskKvTierTest, ARecordBeingReadIsNeverEvicted) {
  auto options = SmallOptions(FreshDir("pinned"), 2);
  auto tier = DiskKvTier::Create(options).value();
  WriteAll(*tier, 0, 2, options.record_payload_bytes);
  std::vector<std::byte> a(static_cast<size_t>(options.record_payload_bytes));
  std::vector<std::byte> b(static_cast<size_t>(options.record_payload_bytes));
  ASSERT_TRUE(tier->StartLoad(HashOf(0), a).ok());
  ASSERT_TRUE(tier->StartLoad(HashOf(1), b).ok());
  auto p = MakePayload(9, options.record_payload_bytes);
  // Both records pinned: the write is refused rather than evicting one.
  EXPECT_EQ(tier->StartSave(HashOf(9), kRootBlockHash, p, Checksum(p)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(tier->CheckInvariants().ok());
  for (const auto& c : tier->Drain()) EXPECT_TRUE(c.status.ok());
  EXPECT_EQ(a, MakePayload(0, options.record_payload_bytes));
  EXPECT_EQ(b, MakePayload(1, options.record_payload_bytes));
}

TEST_F(DiskKvTierTest, BadOptionsNameTheFlag) {
  const std::string dir = FreshDir("bad-options");
  // A directory below a regular file cannot be created.
  const std::string file = dir + "/a-file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  auto options = SmallOptions(file + "/cache", 4);
  auto tier = DiskKvTier::Create(options);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--kv-disk-cache-dir"), std::string::npos) << tier.status();
  options.directory = file;  // a file, not a directory
  tier = DiskKvTier::Create(options);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--kv-disk-cache-dir"), std::string::npos) << tier.status();
  options.directory = "/proc/kvmesh-disk-tier-test";  // a filesystem that refuses writes
  tier = DiskKvTier::Create(options);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--kv-disk-cache-dir"), std::string::npos) << tier.status();
  options.directory = "";
  EXPECT_EQ(DiskKvTier::Create(options).status().code(), absl::StatusCode::kInvalidArgument);

  options = SmallOptions(dir + "/cache", 1);
  options.capacity_bytes -= 1;  // one byte short of a record
  tier = DiskKvTier::Create(options);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--kv-disk-cache-bytes"), std::string::npos) << tier.status();
  options = SmallOptions(dir + "/cache", 4);
  options.record_payload_bytes += 1;
  EXPECT_EQ(DiskKvTier::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// A child writes blocks in a loop (wrapping around a small capacity, so slots are
// overwritten) until it is killed with SIGKILL; the restarted tier serves only blocks
// that verify and hold what was written under their hash.
TEST_F(DiskKvTierTest, KilledWhileWritingRestartsWithOnlyIntactBlocks) {
  const std::string dir = FreshDir("sigkill");
  auto options = SmallOptions(dir, 24);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    auto tier = DiskKvTier::Create(options);
    if (!tier.ok()) ::_exit(2);
    std::map<uint64_t, std::vector<std::byte>> live;
    for (uint64_t key = 0;; ++key) {
      auto& p = live[key] = MakePayload(key, options.record_payload_bytes);
      while (!(*tier)->StartSave(HashOf(key), ParentOf(key), p, Checksum(p)).ok()) {
        for (const auto& c : (*tier)->Poll()) live.erase(c.hash.low - 1);
      }
      for (const auto& c : (*tier)->Poll()) live.erase(c.hash.low - 1);
      if (key == 100) {
        const char c = 1;
        if (::write(ready[1], &c, 1) != 1) ::_exit(3);
      }
    }
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::usleep(20 * 1000);  // well into the next laps of writes
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus));
  ::close(ready[0]);

  auto tier = DiskKvTier::Create(options).value();
  const auto events = tier->DrainEvents();
  EXPECT_GT(tier->num_records(), 0);
  EXPECT_EQ(static_cast<int64_t>(events.size()), tier->num_records());
  for (const KvEvent& e : events) {
    const uint64_t key = e.block_hash.low - 1;
    ASSERT_EQ(e.block_hash, HashOf(key));
    std::vector<std::byte> got;
    ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok()) << key;
    EXPECT_EQ(got, MakePayload(key, options.record_payload_bytes)) << key;
  }
  EXPECT_EQ(tier->stats().checksum_failures, 0);
  EXPECT_TRUE(tier->CheckInvariants().ok());
}

// Fills a tier whose filesystem is smaller than its capacity: writes past the space
// fail with ResourceExhausted, the tier evicts and keeps serving, and every block it
// holds reads back intact.
void ExpectFullDiskEvictsAndKeepsServing(const std::string& dir, int64_t capacity_records) {
  auto options = SmallOptions(dir, capacity_records);
  auto tier = DiskKvTier::Create(options).value();
  std::map<uint64_t, std::vector<std::byte>> payloads;
  int full = 0, ok = 0;
  for (uint64_t key = 0; key < 400; ++key) {
    auto& p = payloads[key] = MakePayload(key, options.record_payload_bytes);
    auto ticket = tier->StartSave(HashOf(key), ParentOf(key), p, Checksum(p));
    if (!ticket.ok()) {
      EXPECT_EQ(ticket.status().code(), absl::StatusCode::kResourceExhausted) << ticket.status();
      ++full;
    }
    for (const auto& c : tier->Drain()) {
      if (c.status.ok()) {
        ++ok;
      } else {
        EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted) << c.status;
        ++full;
      }
    }
    ASSERT_TRUE(tier->CheckInvariants().ok()) << tier->CheckInvariants();
  }
  EXPECT_GT(full, 0);
  EXPECT_GT(ok, 100);  // writes go on succeeding after the disk filled
  EXPECT_GT(tier->stats().write_failures, 0);
  EXPECT_GT(tier->stats().evictions, 0);
  EXPECT_GT(tier->num_records(), 0);
  EXPECT_TRUE(tier->Contains(HashOf(399)));  // the newest write found room
  for (uint64_t key = 0; key < 400; ++key) {
    if (!tier->Contains(HashOf(key))) continue;
    std::vector<std::byte> got;
    ASSERT_TRUE(ReadOne(*tier, key, &got, options.record_payload_bytes).ok()) << key;
    EXPECT_EQ(got, payloads[key]);
  }
}

TEST_F(DiskKvTierTest, FullTmpfsEvictsAndNeverFailsAnIntactRead) {
  const std::string dir = FreshDir("tmpfs");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "); the file-size-limit test covers it";
  }
  ExpectFullDiskEvictsAndKeepsServing(dir, 1000);  // ~12 MiB of capacity on 1 MiB of disk
  ::umount2(dir.c_str(), MNT_DETACH);
}

TEST_F(DiskKvTierTest, FileSizeLimitEvictsAndNeverFailsAnIntactRead) {
  const std::string dir = FreshDir("fsize");
  const int64_t record = DiskRecordBytes(SmallOptions(dir, 1).record_payload_bytes);
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  // 20 records and the 21st's header: its payload write is the first to cross the limit.
  limit.rlim_cur = static_cast<rlim_t>(20 * record + kDiskRecordAlignment);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  ExpectFullDiskEvictsAndKeepsServing(dir, 1000);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, old_handler);
}

// Thousands of seeded write / read / poll / drain / corrupt / restart operations; the
// invariants hold after every one, and every read that succeeds returns exactly what
// was written under its hash.
TEST_F(DiskKvTierTest, RandomizedSoakKeepsInvariants) {
  const std::string dir = FreshDir("soak");
  auto options = SmallOptions(dir, 16, 2, 2048);
  options.queue_depth = 6;
  std::mt19937_64 rng(20261201);
  auto tier = DiskKvTier::Create(options).value();
  std::map<uint64_t, std::vector<std::byte>> write_buffers;  // alive until completion
  std::map<int64_t, std::pair<uint64_t, std::vector<std::byte>>> reads;
  std::map<int64_t, uint64_t> writes;
  int64_t ok_reads = 0, restarts = 0, corruptions = 0, data_loss = 0;
  auto handle = [&](const std::vector<KvIoCompletion>& done) {
    for (const auto& c : done) {
      if (c.kind == KvIoCompletion::Kind::kRead) {
        auto it = reads.find(c.ticket);
        ASSERT_NE(it, reads.end());
        if (c.status.ok()) {
          ++ok_reads;
          ASSERT_EQ(it->second.second, MakePayload(it->second.first, options.record_payload_bytes));
        } else {
          ASSERT_EQ(c.status.code(), absl::StatusCode::kDataLoss) << c.status;
          ++data_loss;
        }
        reads.erase(it);
      } else {
        auto it = writes.find(c.ticket);
        ASSERT_NE(it, writes.end());
        ASSERT_TRUE(c.status.ok()) << c.status;
        write_buffers.erase(it->second);
        writes.erase(it);
      }
    }
  };
  for (int step = 0; step < 4000; ++step) {
    const uint64_t key = rng() % 48;
    switch (rng() % 10) {
      case 0: case 1: case 2: {
        if (write_buffers.contains(key)) break;
        auto& p = write_buffers[key] = MakePayload(key, options.record_payload_bytes);
        auto t = tier->StartSave(HashOf(key), ParentOf(key), p, Checksum(p));
        if (t.ok()) {
          writes[*t] = key;
        } else {
          ASSERT_TRUE(t.status().code() == absl::StatusCode::kAlreadyExists ||
                      t.status().code() == absl::StatusCode::kResourceExhausted) << t.status();
          write_buffers.erase(key);
        }
        break;
      }
      case 3: case 4: case 5: {
        std::vector<std::byte> dst(static_cast<size_t>(options.record_payload_bytes));
        const bool held = tier->Contains(HashOf(key));
        auto t = tier->StartLoad(HashOf(key), dst);
        if (t.ok()) {
          reads[*t] = {key, std::move(dst)};  // the vector's heap buffer does not move
        } else {
          ASSERT_TRUE((!held && t.status().code() == absl::StatusCode::kNotFound) ||
                      t.status().code() == absl::StatusCode::kResourceExhausted) << t.status();
        }
        break;
      }
      case 6: case 7: handle(tier->Poll()); break;
      case 8: handle(tier->Drain()); break;
      case 9: {
        if (rng() % 8 == 0) {  // restart
          handle(tier->Drain());
          tier.reset();
          tier = DiskKvTier::Create(options).value();
          ++restarts;
        } else if (rng() % 4 == 0) {  // corrupt a held record's payload
          if (auto loc = tier->LocationOf(HashOf(key))) {
            handle(tier->Drain());
            CorruptByte(loc->path, loc->offset + kDiskRecordAlignment + static_cast<int64_t>(rng() % 2048));
            ++corruptions;
          }
        }
        break;
      }
    }
    tier->DrainEvents();
    ASSERT_TRUE(tier->CheckInvariants().ok()) << "step " << step << ": " << tier->CheckInvariants();
  }
  handle(tier->Drain());
  EXPECT_TRUE(tier->CheckInvariants().ok());
  EXPECT_GT(ok_reads, 200);
  EXPECT_GT(restarts, 10);
  EXPECT_GT(corruptions, 0);
  EXPECT_LE(data_loss, corruptions);
}

}  // namespace
}  // namespace kvmesh::kv
