// UcxKvTransport between two real UCX contexts (each with its own worker and progress
// thread) in one process, on the transports Debian's UCX has here: shared memory + cma,
// and tcp, and all of them (UCX's choice); and, where one side must be stopped or
// killed, between this process and a peer process (ucx_kv_peer.cc).
#include "kv/transport/ucx/ucx_kv_transport.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "kv/kv_layout.h"
#include "kv/transport/kv_lease_descriptor.h"
#include "kv/transport/kv_runs.h"
#include "kv/transport/ucx/same_host.h"
#include "ucx_kv_peer.h"
#include "util/piped_child.h"

namespace kvmesh::kv {
namespace {

using std::chrono::seconds;

KvLayoutOptions Shape(int32_t num_blocks, int32_t head_dim = 64) {
  return KvLayoutOptions{.num_layers = 4, .num_kv_heads = 3, .head_dim = head_dim, .block_size_tokens = 16,
                         .dtype = DType::kBF16, .num_blocks = num_blocks};
}

std::vector<BlockId> Ids(std::initializer_list<int32_t> v) {
  std::vector<BlockId> out;
  for (int32_t x : v) out.push_back(BlockId{x});
  return out;
}

void FillRandom(KvStorage& s, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* p = reinterpret_cast<uint32_t*>(s.data());
  for (int64_t i = 0; i < s.size_bytes() / 4; ++i) p[i] = rng();
}

// One side's result, waited for with a bound so a broken transport fails the test
// instead of hanging it.
struct Outcome {
  std::promise<std::pair<absl::Status, KvTransferStats>> promise;
  std::future<std::pair<absl::Status, KvTransferStats>> future = promise.get_future();
  std::function<void(const absl::Status&, const KvTransferStats&)> Fn() {
    return [this](const absl::Status& s, const KvTransferStats& st) { promise.set_value({s, st}); };
  }
  std::pair<absl::Status, KvTransferStats> Get() {
    if (future.wait_for(seconds(10)) != std::future_status::ready) {
      return {absl::DeadlineExceededError("test: no outcome within 10 s"), {}};
    }
    return future.get();
  }
};

// UCX_TLS, and whether same-host puts go by cross-memory attach (ucx/cma_put.h) or
// through ucp_put_nbx.
struct Path {
  const char* tls;
  bool cma;
};

class UcxKvTransportTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    UcxKvTransportOptions o{.tls = GetParam().tls, .progress_timeout_ms = 300, .hello_timeout_ms = 300, .keepalive_interval_ms = 50,
                            .receiver_timeout_ms = 300, .ack_timeout_ms = 500, .cross_memory_attach = GetParam().cma,
                            .checksum_runs = true};
    auto r = UcxKvTransport::Create(o);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
    auto s = UcxKvTransport::Create(o);
    ASSERT_TRUE(s.ok()) << s.status();
    sender_ = *std::move(s);
    dst_ = KvStorage::Create(Shape(64)).value();
    src_ = KvStorage::Create(Shape(48)).value();
    FillRandom(*src_, 7);
    dst_pool_ = receiver_->RegisterPool(dst_->data(), dst_->layout()).value();
    src_pool_ = sender_->RegisterPool(src_->data(), src_->layout()).value();
  }

  // Every (layer, i) of the lease equals the source block it was sent from.
  void ExpectLanded(const std::vector<BlockId>& src_ids, const std::vector<BlockId>& dst_ids) {
    for (int32_t layer = 0; layer < 4; ++layer) {
      for (size_t i = 0; i < src_ids.size(); ++i) {
        const auto a = src_->BlockData(layer, src_ids[i]);
        const auto b = dst_->BlockData(layer, dst_ids[i]);
        ASSERT_EQ(XXH64(a.data(), a.size(), 0), XXH64(b.data(), b.size(), 0)) << "layer " << layer << " block " << i;
      }
    }
  }

  bool DestinationUntouched() {
    for (int64_t i = 0; i < dst_->size_bytes(); ++i) {
      if (dst_->data()[i] != std::byte{0}) return false;
    }
    return true;
  }

  std::unique_ptr<UcxKvTransport> receiver_, sender_;
  std::unique_ptr<KvStorage> dst_, src_;
  KvPoolHandle dst_pool_, src_pool_;
};

TEST_P(UcxKvTransportTest, MergedRunsLandByteForByte) {
  const auto dst_ids = Ids({5, 6, 7, 20, 21, 40, 41, 42, 43, 2});
  const auto src_ids = Ids({10, 11, 12, 13, 14, 30, 31, 32, 33, 1});  // runs: [0,3) [3,5) [5,9) [9,10)
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = dst_ids}, lease.Fn());
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto push = sender_->OpenPush(src_pool_, grant->descriptor);
  ASSERT_TRUE(push.ok()) << push.status();
  for (int32_t layer = 0; layer < 4; ++layer) {
    // Two calls per layer, as a chunked prefill makes them.
    ASSERT_TRUE((*push)->PutLayer(layer, 0, std::span(src_ids).subspan(0, 6)).ok());
    ASSERT_TRUE((*push)->PutLayer(layer, 6, std::span(src_ids).subspan(6)).ok());
  }
  (*push)->Finish(push_done.Fn());
  const auto [push_status, stats] = push_done.Get();
  ASSERT_TRUE(push_status.ok()) << push_status;
  const auto [lease_status, lease_stats] = lease.Get();
  ASSERT_TRUE(lease_status.ok()) << lease_status;
  ExpectLanded(src_ids, dst_ids);
  EXPECT_EQ(stats.blocks, 4 * 10);
  EXPECT_EQ(stats.bytes, 4 * 10 * dst_->layout().BlockBytes());
  EXPECT_EQ(lease_stats.bytes, stats.bytes);
  // 4 merged runs, one of them split by the call boundary: 5 puts per layer.
  EXPECT_EQ(stats.descriptors, 4 * 5);
  EXPECT_EQ(stats.runs, 5);
  EXPECT_LE(stats.descriptors, 4 * stats.runs);
  EXPECT_EQ(receiver_->num_open_leases(), 0);
  EXPECT_EQ(sender_->num_open_pushes(), 0);
}

// Both transports run in this process: the receiver is on this host, and its
// endpoint must go over shared memory wherever UCX_TLS allows it, even with tcp allowed
// (asking UCX for peer-failure handling would put it on tcp, over any device with an
// address), and over tcp only when that is all there is.
TEST_P(UcxKvTransportTest, SameHostReceiverIsReachedOverSharedMemoryWhenAllowed) {
  const auto ids = Ids({1, 2, 3});
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = ids}, lease.Fn());
  ASSERT_TRUE(grant.ok()) << grant.status();
  auto push = sender_->OpenPush(src_pool_, grant->descriptor);
  ASSERT_TRUE(push.ok()) << push.status();
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE((*push)->PutLayer(layer, 0, ids).ok());
  const std::vector<std::string> lanes = sender_->peer_transports();
  (*push)->Finish(push_done.Fn());
  ASSERT_TRUE(push_done.Get().first.ok());
  ASSERT_TRUE(lease.Get().first.ok());
  ASSERT_FALSE(lanes.empty());
  const bool shm = UcxTlsAllowsSharedMemory(GetParam().tls);
  for (const std::string& lane : lanes) {
    EXPECT_EQ(lane.rfind("tcp/", 0) == 0, !shm) << lane << " (UCX_TLS " << GetParam().tls << ")";
  }
}

TEST_P(UcxKvTransportTest, ContiguousPromptIsOnePutPerLayer) {
  std::vector<BlockId> src_ids, dst_ids;
  for (int32_t i = 0; i < 40; ++i) {
    src_ids.push_back(BlockId{i});
    dst_ids.push_back(BlockId{20 + i});
  }
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = dst_ids}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE(push->PutLayer(layer, 0, src_ids).ok());
  push->Finish(push_done.Fn());
  const auto [status, stats] = push_done.Get();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(lease.Get().first.ok());
  ExpectLanded(src_ids, dst_ids);
  EXPECT_EQ(stats.descriptors, 4);
}

// Few descriptors: one put per layer and merged run, never one per block.
TEST_P(UcxKvTransportTest, DescriptorsAreAtMostLayersTimesRuns) {
  const auto dst_ids = Ids({5, 6, 7, 8, 30, 31, 50, 9, 10, 11, 12, 13});
  const auto src_ids = Ids({0, 1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24});  // runs: [0,4) [4,6) [6,7) [7,12)
  const size_t merged = MergeKvRuns(src_ids, dst_ids).size();
  ASSERT_EQ(merged, 4u);
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = dst_ids}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE(push->PutLayer(layer, 0, src_ids).ok());
  push->Finish(push_done.Fn());
  const auto [status, stats] = push_done.Get();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(lease.Get().first.ok());
  ExpectLanded(src_ids, dst_ids);
  EXPECT_EQ(stats.runs, static_cast<int64_t>(merged));
  EXPECT_EQ(stats.descriptors, 4 * static_cast<int64_t>(merged));
  EXPECT_LE(stats.descriptors, 4 * stats.runs);
  EXPECT_LT(stats.descriptors, stats.blocks);  // 16 puts for 48 (layer, block) pairs
}

TEST_P(UcxKvTransportTest, IncompleteTransferFailsBothSides) {
  const auto ids = Ids({1, 2, 3});
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = ids}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  ASSERT_TRUE(push->PutLayer(0, 0, ids).ok());  // layers 1..3 never sent
  push->Finish(push_done.Fn());
  EXPECT_EQ(push_done.Get().first.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kDataLoss);
}

TEST_P(UcxKvTransportTest, RunOutsideTheLeaseIsRefusedAndNothingWritten) {
  const auto ids = Ids({1, 2, 3});
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = ids}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  EXPECT_EQ(push->PutLayer(0, 1, Ids({1, 2, 3})).code(), absl::StatusCode::kInvalidArgument);  // index 3 of 3
  EXPECT_EQ(push->PutLayer(4, 0, ids).code(), absl::StatusCode::kInvalidArgument);             // layer 4 of 4
  EXPECT_EQ(push->PutLayer(0, 0, Ids({1, 2, 48})).code(), absl::StatusCode::kInvalidArgument);  // local 48 of 48
  ASSERT_TRUE(push->PutLayer(0, 0, ids).ok());
  EXPECT_EQ(push->PutLayer(0, 2, Ids({5})).code(), absl::StatusCode::kInvalidArgument);  // already put
  push->Cancel();
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kAborted);
}

TEST_P(UcxKvTransportTest, NothingIsWrittenForRefusedPuts) {
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1, 2})}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  EXPECT_FALSE(push->PutLayer(0, 0, Ids({1, 2, 3})).ok());
  push->Cancel();
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(DestinationUntouched());
}

// A lease closed before the sender came (so never open for it): refused, nothing left
// open on the sender once OpenPush returned.
TEST_P(UcxKvTransportTest, UnknownLeaseIsRefused) {
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1})}, lease.Fn()).value();
  receiver_->CloseLease(grant.lease_token, absl::CancelledError("test closed it"));
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);
  auto push = sender_->OpenPush(src_pool_, grant.descriptor);
  EXPECT_EQ(push.status().code(), absl::StatusCode::kNotFound) << push.status();
  EXPECT_TRUE(DestinationUntouched());
  EXPECT_EQ(sender_->num_open_pushes(), 0);
}

// A well-formed descriptor naming a lease id this receiver never granted.
TEST_P(UcxKvTransportTest, NeverGrantedLeaseIsRefused) {
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1, 2})}, lease.Fn()).value();
  KvLeaseDescriptor forged = DecodeKvLeaseDescriptor(grant.descriptor).value();
  forged.lease_token ^= 0x5a5a5a5a5a5a5a5aULL;
  auto push = sender_->OpenPush(src_pool_, EncodeKvLeaseDescriptor(forged));
  EXPECT_EQ(push.status().code(), absl::StatusCode::kNotFound) << push.status();
  EXPECT_NE(push.status().message().find("not open here"), std::string::npos) << push.status();
  EXPECT_EQ(sender_->num_open_pushes(), 0);
  EXPECT_EQ(receiver_->num_open_leases(), 1);  // the real lease is untouched
  receiver_->CloseLease(grant.lease_token, absl::CancelledError("done"));
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(DestinationUntouched());
}

TEST_P(UcxKvTransportTest, SpecMismatchIsRefused) {
  auto other = KvStorage::Create(Shape(48, /*head_dim=*/32)).value();
  const KvPoolHandle other_pool = sender_->RegisterPool(other->data(), other->layout()).value();
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1})}, lease.Fn()).value();
  auto push = sender_->OpenPush(other_pool, grant.descriptor);
  EXPECT_EQ(push.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(push.status().message().find("head_dim"), std::string::npos) << push.status();
  receiver_->CloseLease(grant.lease_token, absl::CancelledError("done"));
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);  // CloseLease is asynchronous
  EXPECT_TRUE(DestinationUntouched());
}

TEST_P(UcxKvTransportTest, MalformedDescriptorsAreRefused) {
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1})}, lease.Fn()).value();
  std::string truncated = grant.descriptor.substr(0, grant.descriptor.size() / 2);
  EXPECT_EQ(sender_->OpenPush(src_pool_, truncated).status().code(), absl::StatusCode::kInvalidArgument);
  std::string flipped = grant.descriptor;
  flipped[flipped.size() / 2] ^= 1;
  EXPECT_EQ(sender_->OpenPush(src_pool_, flipped).status().code(), absl::StatusCode::kInvalidArgument);
  // Well framed but with a remote key or worker address UCX cannot use.
  KvLeaseDescriptor d = DecodeKvLeaseDescriptor(grant.descriptor).value();
  KvLeaseDescriptor bad_key = d;
  bad_key.remote_key = std::string(3, '\xff');
  EXPECT_EQ(sender_->OpenPush(src_pool_, EncodeKvLeaseDescriptor(bad_key)).status().code(),
            absl::StatusCode::kInvalidArgument);
  KvLeaseDescriptor bad_address = d;
  bad_address.worker_address = std::string(2, '\0');
  EXPECT_EQ(sender_->OpenPush(src_pool_, EncodeKvLeaseDescriptor(bad_address)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->OpenPush(src_pool_, "").status().code(), absl::StatusCode::kInvalidArgument);
  receiver_->CloseLease(grant.lease_token, absl::CancelledError("done"));
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(DestinationUntouched());
}

TEST_P(UcxKvTransportTest, SilentSenderFailsTheLeaseAtTheProgressDeadline) {
  Outcome lease;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = Ids({1})}, lease.Fn()).value();
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(receiver_->num_open_leases(), 0);
}

// A receiver with checksum_runs requires the checksum of every run: a sender that sends
// none is refused (DataLoss), not trusted.
TEST_P(UcxKvTransportTest, ASenderWithoutChecksumsIsRefused) {
  UcxKvTransportOptions o{.tls = GetParam().tls, .progress_timeout_ms = 300, .keepalive_interval_ms = 50,
                          .receiver_timeout_ms = 300, .ack_timeout_ms = 500, .cross_memory_attach = GetParam().cma,
                          .checksum_runs = false};
  auto unchecked = UcxKvTransport::Create(o).value();
  const KvPoolHandle pool = unchecked->RegisterPool(src_->data(), src_->layout()).value();
  const auto ids = Ids({1, 2, 3});
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = ids}, lease.Fn()).value();
  auto push = unchecked->OpenPush(pool, grant.descriptor).value();
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE(push->PutLayer(layer, 0, ids).ok());
  push->Finish(push_done.Fn());
  EXPECT_EQ(push_done.Get().first.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kDataLoss);
}

// The decode side goes away mid-transfer: the push fails (tcp: UCX's endpoint error;
// shm: the missing ProgressAcks) and on_done runs, so the sender can unpin its blocks.
TEST_P(UcxKvTransportTest, ReceiverGoneFailsTheSender) {
  const auto ids = Ids({1, 2});
  Outcome lease, push_done;
  auto grant = receiver_->OpenLease(dst_pool_, {.block_ids = ids}, lease.Fn()).value();
  auto push = sender_->OpenPush(src_pool_, grant.descriptor).value();
  receiver_.reset();  // the decode side went away mid-transfer
  EXPECT_EQ(lease.Get().first.code(), absl::StatusCode::kCancelled);
  for (int32_t layer = 0; layer < 4; ++layer) (void)push->PutLayer(layer, 0, ids);
  push->Finish(push_done.Fn());
  const absl::Status s = push_done.Get().first;
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(sender_->num_open_pushes(), 0);
}

// ---- Two processes: this one and ucx_kv_peer, which a test stops, resumes or kills ----

// ucx_kv_peer run with `args`, its stdin and stdout piped to this process. Killed (if
// still running) and reaped on destruction.
class PeerProcess {
 public:
  explicit PeerProcess(std::vector<std::string> args) {
    args.insert(args.begin(), KVMESH_UCX_KV_PEER);
    const testing::PipedChild child = testing::SpawnPiped(std::move(args));
    EXPECT_GT(child.pid, 0);
    pid_ = child.pid;
    to_ = child.to;
    from_ = child.from;
  }
  ~PeerProcess() {
    if (to_ >= 0) close(to_);
    close(from_);
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  // A line of its stdout, without the newline; empty after 10 s or at its end.
  std::string ReadLine() {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{.fd = from_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char c = 0;
      if (read(from_, &c, 1) != 1) break;
      if (c == '\n') return line;
      line.push_back(c);
    }
    return "";
  }
  void WriteLine(const std::string& line) {
    const std::string text = line + "\n";
    EXPECT_EQ(write(to_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // Closing its stdin lets it exit.
  void CloseStdin() {
    close(to_);
    to_ = -1;
  }
  // Whether it stopped (SIGSTOP), within 10 s.
  bool WaitStopped() { return Wait(WUNTRACED, [](int status) { return WIFSTOPPED(status); }); }
  // Whether it exited (or was killed), within 10 s.
  bool WaitExited() {
    reaped_ = Wait(0, [](int status) { return WIFEXITED(status) || WIFSIGNALED(status); });
    return reaped_;
  }

 private:
  template <typename Pred>
  bool Wait(int flags, Pred pred) {
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG | flags) == pid_ && pred(status)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  bool reaped_ = false;
};

// Whether every byte of `ids` in every layer of `pool` is `value`.
bool BlocksHold(const KvStorage& pool, const std::vector<BlockId>& ids, int value, int32_t only_layer = -1) {
  for (int32_t layer = 0; layer < pool.layout().num_layers(); ++layer) {
    if (only_layer >= 0 && layer != only_layer) continue;
    for (const BlockId id : ids) {
      for (const std::byte b : pool.BlockData(layer, id)) {
        if (b != static_cast<std::byte>(value)) return false;
      }
    }
  }
  return true;
}

void FillBlocks(KvStorage& pool, const std::vector<BlockId>& ids, int value) {
  for (int32_t layer = 0; layer < pool.layout().num_layers(); ++layer) {
    for (const BlockId id : ids) {
      const std::span<std::byte> b = pool.BlockData(layer, id);
      std::memset(b.data(), value, b.size());
    }
  }
}

// The receiver's side of the fence cases: a pool on shared memory + cma (so the peer
// sender writes by cross-memory attach) and a lease over 8 of its blocks whose
// on_released hands them at once to "the next request", which fills them with
// kNextRequestByte, as the engine would reuse them.
class UcxKvFenceTest : public ::testing::Test {
 protected:
  static constexpr int kNextRequestByte = 0x3C;

  void SetUp() override {
    receiver_ = UcxKvTransport::Create({.tls = "sm", .progress_timeout_ms = 300, .keepalive_interval_ms = 50,
                                        .receiver_timeout_ms = 300, .ack_timeout_ms = 500})
                    .value();
    dst_ = KvStorage::Create(PeerPoolShape()).value();
    pool_ = receiver_->RegisterPool(dst_->data(), dst_->layout()).value();
    for (int32_t i = 8; i < 16; ++i) ids_.push_back(BlockId{i});
  }

  // Opens the lease and starts a peer sender into it that stops itself just before its
  // first cross-memory-attach write; returns once it has stopped there.
  std::unique_ptr<PeerProcess> StartSenderThatStopsBeforeItsFirstWrite() {
    auto grant = receiver_->OpenLease(pool_, {.block_ids = ids_, .on_released = [this] {
                                                FillBlocks(*dst_, ids_, kNextRequestByte);
                                                released_.set_value();
                                              }},
                                      lease_.Fn());
    EXPECT_TRUE(grant.ok()) << grant.status();
    auto sender = std::make_unique<PeerProcess>(std::vector<std::string>{"sender", "sm", "1"});
    sender->WriteLine(absl::BytesToHexString(grant->descriptor));
    EXPECT_EQ(sender->ReadLine(), "open 0");
    EXPECT_TRUE(sender->WaitStopped());
    return sender;
  }

  std::unique_ptr<UcxKvTransport> receiver_;
  std::unique_ptr<KvStorage> dst_;
  KvPoolHandle pool_;
  std::vector<BlockId> ids_;
  Outcome lease_;
  std::promise<void> released_;
  std::future<void> released_future_ = released_.get_future();
};

// A sender stopped inside its write loop (after its last check, before its write) is
// still running as far as its receiver can tell; its lease fails at the progress
// deadline, but its blocks are not handed back until the sender, resumed, has made its
// late write and said it writes no more: the next request's KV is never overwritten.
TEST_F(UcxKvFenceTest, AStoppedWritersLateWriteLandsBeforeItsBlocksAreReleased) {
  std::unique_ptr<PeerProcess> sender = StartSenderThatStopsBeforeItsFirstWrite();
  EXPECT_EQ(lease_.Get().first.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(released_future_.wait_for(seconds(1)), std::future_status::timeout)
      << "the blocks were released while their writer could still write";
  EXPECT_EQ(receiver_->num_fenced_leases(), 1);
  kill(sender->pid(), SIGCONT);
  ASSERT_EQ(released_future_.wait_for(seconds(10)), std::future_status::ready)
      << "the resumed writer's lease was never released";
  EXPECT_EQ(receiver_->num_fenced_leases(), 0);
  sender->CloseStdin();
  ASSERT_TRUE(sender->WaitExited());
  // Nothing the writer did after the release reached the next request's blocks.
  EXPECT_TRUE(BlocksHold(*dst_, ids_, kNextRequestByte)) << "a late write corrupted the next request's KV";
}

// A stopped writer that is killed never writes again: its lease is released once its
// process is gone, without any word from it.
TEST_F(UcxKvFenceTest, AKilledWritersLeaseIsReleasedWhenItsProcessIsGone) {
  std::unique_ptr<PeerProcess> sender = StartSenderThatStopsBeforeItsFirstWrite();
  EXPECT_EQ(lease_.Get().first.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(released_future_.wait_for(seconds(1)), std::future_status::timeout);
  kill(sender->pid(), SIGKILL);
  ASSERT_TRUE(sender->WaitExited());
  ASSERT_EQ(released_future_.wait_for(seconds(5)), std::future_status::ready)
      << "the dead writer's lease was never released";
  EXPECT_EQ(receiver_->num_fenced_leases(), 0);
  EXPECT_TRUE(BlocksHold(*dst_, ids_, kNextRequestByte));
}

// A kernel that refuses cross-memory attach (ptrace policy, seccomp) fails the push that
// finds out; the transport's later pushes to same-host receivers go as rendezvous runs
// over an endpoint with peer-failure handling, and land.
TEST(UcxKvCmaRefusedTest, TheFirstRefusalFailsItsPushAndLaterPushesGoOverUcx) {
  UcxKvTransportOptions o{.tls = "all", .progress_timeout_ms = 300, .keepalive_interval_ms = 50,
                          .receiver_timeout_ms = 300, .ack_timeout_ms = 500};
  auto receiver = UcxKvTransport::Create(o).value();
  o.cma_write = [](pid_t, const std::byte*, size_t, uint64_t) { return absl::PermissionDeniedError("EPERM"); };
  auto sender = UcxKvTransport::Create(o).value();
  auto dst = KvStorage::Create(PeerPoolShape()).value();
  auto src = KvStorage::Create(PeerPoolShape()).value();
  FillRandom(*src, 11);
  const KvPoolHandle dst_pool = receiver->RegisterPool(dst->data(), dst->layout()).value();
  const KvPoolHandle src_pool = sender->RegisterPool(src->data(), src->layout()).value();
  const auto ids = Ids({4, 5, 6});
  {
    Outcome lease, push_done;
    auto grant = receiver->OpenLease(dst_pool, {.block_ids = ids}, lease.Fn()).value();
    auto push = sender->OpenPush(src_pool, grant.descriptor).value();
    EXPECT_EQ(push->PutLayer(0, 0, ids).code(), absl::StatusCode::kAborted);
    push->Finish(push_done.Fn());
    EXPECT_EQ(push_done.Get().first.code(), absl::StatusCode::kAborted);
    EXPECT_FALSE(lease.Get().first.ok());
  }
  Outcome lease, push_done;
  auto grant = receiver->OpenLease(dst_pool, {.block_ids = ids}, lease.Fn()).value();
  auto push = sender->OpenPush(src_pool, grant.descriptor).value();
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE(push->PutLayer(layer, 0, ids).ok());
  push->Finish(push_done.Fn());
  ASSERT_TRUE(push_done.Get().first.ok());
  ASSERT_TRUE(lease.Get().first.ok());
  for (int32_t layer = 0; layer < 4; ++layer) {
    for (const BlockId id : ids) {
      const auto a = src->BlockData(layer, id);
      const auto b = dst->BlockData(layer, id);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << "layer " << layer << " block " << id.value;
    }
  }
  const std::vector<std::string> lanes = sender->peer_transports();
  EXPECT_TRUE(std::any_of(lanes.begin(), lanes.end(), [](const std::string& l) { return l.rfind("tcp/", 0) == 0; }))
      << "no endpoint with peer-failure handling (tcp) to the receiver";
}

// Rendezvous runs posted to a receiver that then dies (killed while stopped, so they
// are still waiting for it) are all returned to UCX: the sender ends its push and holds
// no request afterwards.
struct KilledReceiver {
  const char* tls;
  int64_t receiver_timeout_ms;  // 60 s: UCX's endpoint error (tcp) ends the push
  bool kill_before_timeout;
};
class UcxKvRequestTest : public ::testing::TestWithParam<KilledReceiver> {};

TEST_P(UcxKvRequestTest, RunsToAKilledReceiverAreAllReturnedToUcx) {
  auto sender = UcxKvTransport::Create({.tls = GetParam().tls, .keepalive_interval_ms = 50,
                                        .receiver_timeout_ms = GetParam().receiver_timeout_ms,
                                        .ack_timeout_ms = 60'000, .cross_memory_attach = false})
                    .value();
  auto src = KvStorage::Create(PeerPoolShape()).value();
  FillRandom(*src, 3);
  const KvPoolHandle pool = sender->RegisterPool(src->data(), src->layout()).value();
  PeerProcess receiver({"receiver", GetParam().tls, "48"});
  const std::string descriptor = absl::HexStringToBytes(receiver.ReadLine());
  auto push = sender->OpenPush(pool, descriptor);
  ASSERT_TRUE(push.ok()) << push.status();
  kill(receiver.pid(), SIGSTOP);
  ASSERT_TRUE(receiver.WaitStopped());
  // Alternate source blocks: 48 one-block runs a layer, 192 rendezvous sends in all,
  // which the stopped receiver never takes.
  std::vector<BlockId> src_ids;
  for (int32_t i = 0; i < 48; ++i) src_ids.push_back(BlockId{(i % 2) * 32 + i / 2});
  for (int32_t layer = 0; layer < 4; ++layer) ASSERT_TRUE((*push)->PutLayer(layer, 0, src_ids).ok());
  for (int i = 0; i < 500 && sender->num_outstanding_requests() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(sender->num_outstanding_requests(), 0);
  if (!GetParam().kill_before_timeout) {
    std::this_thread::sleep_for(std::chrono::milliseconds(GetParam().receiver_timeout_ms * 2));
  }
  kill(receiver.pid(), SIGKILL);
  ASSERT_TRUE(receiver.WaitExited());
  Outcome done;
  (*push)->Finish(done.Fn());
  EXPECT_EQ(done.Get().first.code(), absl::StatusCode::kUnavailable);
  for (int i = 0; i < 500 && sender->num_outstanding_requests() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sender->num_outstanding_requests(), 0) << "requests to the dead receiver were never returned to UCX";
  EXPECT_EQ(sender->num_open_pushes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Receivers, UcxKvRequestTest,
                         ::testing::Values(KilledReceiver{"tcp", 60'000, true}, KilledReceiver{"tcp", 300, false},
                                           KilledReceiver{"all", 60'000, true}, KilledReceiver{"all", 300, false}));

INSTANTIATE_TEST_SUITE_P(Transports, UcxKvTransportTest,
                         ::testing::Values(Path{"all", true}, Path{"sm", true}, Path{"sm", false}, Path{"tcp", true}),
                         [](const auto& info) {
                           return std::string(info.param.tls) + (info.param.cma ? "" : "_ucx_put");
                         });

}  // namespace
}  // namespace kvmesh::kv
