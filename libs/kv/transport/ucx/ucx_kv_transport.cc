#include "kv/transport/ucx/ucx_kv_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "kv/checksum.h"
#include "kv/kv_block_spec.h"
#include "kv/transport/kv_lease_descriptor.h"
#include "kv/transport/ucx/cma_put.h"
#include "kv/transport/ucx/same_host.h"
#include "kv/transport/ucx/writer_fence.h"
#include "kv/transport/kv_runs.h"

namespace kvmesh::kv {
namespace {

using Clock = std::chrono::steady_clock;

// Active-message ids. To the receiver: Hello, Progress, Done, Abort, Fenced, Sums. Back
// to the sender: HelloAck, DoneAck, Refused, ProgressAck (the receiver's keepalive).
enum AmId : unsigned {
  kHello = 1,
  kProgress,
  kDone,
  kAbort,
  kHelloAck,
  kDoneAck,
  kRefused,
  kProgressAck,
  kFenced,
  kSums,
  kRun,
};
constexpr unsigned kLastAmId = kSums;  // the control messages; kRun has its own handler

// Every message starts with the lease token and the sender's push id.
struct MsgHead {
  uint64_t lease_token;
  uint64_t push_id;
};
// Hello: then who will write. A sender that writes by cross-memory attach names its
// process, which the receiver watches (writer_fence.h) from then on.
struct HelloBody {
  int32_t writer_pid;  // > 0 with kWritesDirectly
  uint32_t flags;
};
constexpr uint32_t kWritesDirectly = 1;
// Done: then the counts, then num_checksums RunChecksum records.
struct DoneBody {
  int64_t blocks;
  int64_t bytes;
  int64_t cma_blocks;  // of `blocks`, written by cross-memory attach (the receiver saw none of them)
  uint32_t num_checksums;
};
// One run: which (layer, lease indices) it fills, and (with checksum_runs) what they hold.
struct RunChecksum {
  int32_t layer;
  int32_t first_index;  // into the lease's block ids
  int32_t num_blocks;
  uint64_t checksum;  // kv::Checksum of the run's bytes in that layer
};
// A run's data message (kRun, the data its payload).
struct RunHead {
  uint64_t lease_token;
  uint64_t push_id;
  RunChecksum run;
  uint32_t checksummed;  // 1: run.checksum holds the run's checksum
};
// Sums: then num_runs RunChecksum records, of runs the sender wrote by cross-memory
// attach and that have landed (sent after each PutLayer's writes).
struct SumsBody {
  uint32_t num_runs;
};
// Answers: then a status code and its message's bytes.
struct AnswerBody {
  int32_t code;
  uint32_t message_bytes;
};

template <typename T>
void Append(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <typename T>
bool Take(std::string_view& in, T& value) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(&value, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

absl::Status UcsError(const char* what, ucs_status_t status) {
  return absl::InternalError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

int64_t MsSince(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
}

struct Pool {
  std::byte* base = nullptr;
  KvLayout layout;
  ucp_mem_h memh = nullptr;
  std::string rkey;
};

// The receiver's record of one lease (worker thread only).
struct Lease {
  KvPoolHandle pool;
  std::vector<BlockId> block_ids;
  KvLeaseDoneFn on_done;
  Clock::time_point last_heard;
  bool has_sender = false;
  uint64_t sender_push_id = 0;
  ucp_ep_h reply_ep = nullptr;
  // Runs received (kRun): [layer * block_ids.size() + index] taken by a run, how many of
  // those landed, and how many are still being received into the pool.
  std::vector<bool> taken;
  int64_t num_landed = 0;
  int32_t runs_in_flight = 0;
  // (layer, block) pairs whose bytes were checked against the sender's checksums
  // (VerifyRun), as they landed.
  std::vector<bool> verified;
  int64_t num_verified = 0;
  // The lease ended while runs were still landing: it ends with this once they have
  // (its blocks must not be handed back while UCX writes into them).
  std::optional<std::pair<absl::Status, KvTransferStats>> ending;
  // A Done that arrived before every run had landed (its body), answered once they have.
  std::optional<std::string> pending_done;
  // The sender writes by cross-memory attach (its Hello said so): a lease that ends
  // before it said it writes no more (its Done or Fenced) is fenced (writer_fence.h).
  std::optional<WriterProcess> direct_writer;
  bool writer_stopped = false;
  KvLeaseReleasedFn on_released;
};

// A connection to one remote worker, shared by the pushes to it (worker thread only).
struct Peer {
  ucp_ep_h ep = nullptr;
  bool failed = false;
  absl::Status error;
  // UCP_ERR_HANDLING_MODE_PEER: UCX fails the endpoint when the peer dies, and a
  // force-close completes (UCS_ERR_CANCELED) every request still on it. Without it
  // (shared memory) ucp_ep_close_nbx refuses FORCE (UCS_ERR_INVALID_PARAM: the
  // endpoint is not closed at all), a flushing close waits for the peer, and nothing
  // cancels a send (ucp_request_cancel cancels tag receives only; UCX 1.13's
  // ucp_request.c): a run to a receiver that died there would never be returned.
  // So runs go over such an endpoint only where UCX_TLS leaves no other (Connect).
  bool peer_failure_handling = false;
};

}  // namespace

// The push's shared state: PutLayer's checks happen under mu on the caller's thread;
// everything UCX happens on the worker thread.
struct PushState {
  uint64_t id = 0;
  KvLeaseDescriptor dest;
  std::byte* local_base = nullptr;
  std::optional<KvLayout> local_layout;
  Clock::time_point start;
  // > 0: runs are written by cross-memory attach into this process (ucx/cma_put.h), on
  // PutLayer's thread. Set by OpenPush, before anything else reads it.
  std::atomic<pid_t> cma_pid{0};

  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> sent;  // [layer * num_lease_blocks + index]
  std::vector<int64_t> puts_per_layer;
  bool finishing = false;
  bool cancelled = false;
  absl::Status error;  // first failure
  std::optional<absl::Status> hello;  // the HelloAck's answer
  KvTransferStats stats;
  int64_t cma_blocks = 0;  // (layer, block) pairs written by cross-memory attach
  // PutLayer calls inside their cross-memory-attach write loop. The Done and the Fenced
  // wait for 0; a loop checks the push before each write, so none starts once it ended.
  int32_t cma_writers = 0;
  // Its Hello told the receiver it writes directly: once the push fails, the receiver
  // is told when none of its writes can land any more (Fenced).
  bool announced_direct = false;
  KvPushDoneFn on_done;
  std::optional<absl::Status> done_answer;  // the DoneAck's answer
  bool done = false;

  // Worker thread only.
  std::string peer_key;     // its connection's key in peers_ (PeerEndpoint)
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  int64_t inflight = 0;     // runs and flushes not yet completed
  bool flush_posted = false;
  bool done_sent = false;
  bool cancelled_on_worker = false;
  bool fence_sent = false;
  Clock::time_point last_keepalive;
  Clock::time_point last_heard_receiver;  // any answer from the receiver
  Clock::time_point ack_deadline;
  // The peer was lost and its endpoint force-closed: puts still counted in flight will
  // never write anything, so on_done need not wait for them.
  bool abandoned = false;
};

class UcxKvTransport::Impl {
 public:
  explicit Impl(const UcxKvTransportOptions& options)
      : options_(options),
        cma_allowed_(options.cross_memory_attach && UcxTlsAllowsCma(options.tls)),
        shm_allowed_(UcxTlsAllowsSharedMemory(options.tls)),
        host_identity_(LocalHostIdentity()) {
    std::random_device rd;
    token_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  absl::Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return UcsError("ucp_config_read", s);
    if (!options_.tls.empty()) {
      s = ucp_config_modify(config, "TLS", options_.tls.c_str());
      if (s != UCS_OK) {
        ucp_config_release(config);
        return absl::InvalidArgumentError(absl::StrCat("UCX_TLS '", options_.tls, "': ", ucs_status_string(s)));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    // WAKEUP: the idle loop sleeps on the worker's event fd, so a message (a Done)
    // wakes it at once instead of at the next poll tick (the transfer tail).
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "kvmesh-kv";
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return UcsError("ucp_init", s);
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    s = ucp_worker_create(context_, &wparams, &worker_);
    if (s != UCS_OK) return UcsError("ucp_worker_create", s);
    ucp_address_t* address = nullptr;
    size_t address_bytes = 0;
    s = ucp_worker_get_address(worker_, &address, &address_bytes);
    if (s != UCS_OK) return UcsError("ucp_worker_get_address", s);
    worker_address_.assign(reinterpret_cast<const char*>(address), address_bytes);
    ucp_worker_release_address(worker_, address);
    if (ucp_worker_get_efd(worker_, &worker_efd_) != UCS_OK) worker_efd_ = -1;  // then poll ticks only
    task_efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (task_efd_ < 0) return absl::InternalError("eventfd failed");
    for (unsigned id = kHello; id <= kLastAmId; ++id) {
      ucp_am_handler_param_t h{};
      h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      h.id = id;
      h.cb = &Impl::OnAm;
      am_args_[id] = AmArg{this, id};
      h.arg = &am_args_[id];
      s = ucp_worker_set_am_recv_handler(worker_, &h);
      if (s != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", s);
    }
    ucp_am_handler_param_t run{};
    run.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    run.id = kRun;
    run.cb = &Impl::OnRunAm;
    run.arg = this;
    s = ucp_worker_set_am_recv_handler(worker_, &run);
    if (s != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", s);
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~Impl() {
    if (thread_.joinable()) {
      RunSync([this] { Shutdown(); });
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      Wake();
      thread_.join();
    }
    if (task_efd_ >= 0) close(task_efd_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    for (Pool& p : pools_) {
      if (p.memh != nullptr) ucp_mem_unmap(context_, p.memh);
    }
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  // ---- Receiver ----

  absl::StatusOr<KvPoolHandle> RegisterPool(std::byte* base, const KvLayout& layout) {
    if (base == nullptr || layout.TotalBytes() <= 0) return absl::InvalidArgumentError("RegisterPool: empty pool");
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = static_cast<size_t>(layout.TotalBytes());
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) return UcsError("ucp_mem_map", s);
    void* rkey_buffer = nullptr;
    size_t rkey_bytes = 0;
    s = ucp_rkey_pack(context_, memh, &rkey_buffer, &rkey_bytes);
    if (s != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      return UcsError("ucp_rkey_pack", s);
    }
    std::string rkey(static_cast<const char*>(rkey_buffer), rkey_bytes);
    ucp_rkey_buffer_release(rkey_buffer);
    std::lock_guard<std::mutex> lock(pools_mu_);
    pools_.push_back(Pool{.base = base, .layout = layout, .memh = memh, .rkey = std::move(rkey)});
    return KvPoolHandle{static_cast<int32_t>(pools_.size() - 1)};
  }

  absl::StatusOr<KvLeaseGrant> OpenLease(KvPoolHandle pool, KvLeaseOptions options, KvLeaseDoneFn on_done) {
    KvLeaseDescriptor d;
    {
      std::lock_guard<std::mutex> lock(pools_mu_);
      if (pool.value < 0 || pool.value >= static_cast<int32_t>(pools_.size())) {
        return absl::InvalidArgumentError(absl::StrCat("OpenLease: unknown pool ", pool.value));
      }
      const Pool& p = pools_[pool.value];
      d.spec = KvBlockSpecOf(p.layout);
      d.pool_num_blocks = p.layout.num_blocks();
      d.remote_base = reinterpret_cast<uint64_t>(p.base);
      d.remote_key = p.rkey;
    }
    std::vector<bool> seen(d.pool_num_blocks, false);
    for (const BlockId id : options.block_ids) {
      if (id.value < 0 || id.value >= d.pool_num_blocks || seen[id.value]) {
        return absl::InvalidArgumentError(absl::StrCat("OpenLease: block ", id.value, " out of range or repeated"));
      }
      seen[id.value] = true;
    }
    d.lease_token = token_salt_ ^ (next_token_.fetch_add(1) * 0x9E3779B97F4A7C15ULL);
    d.block_ids = options.block_ids;
    d.worker_address = worker_address_;
    d.host_identity = host_identity_;
    if (cma_allowed_) d.receiver_pid = static_cast<int32_t>(::getpid());
    KvLeaseGrant grant{.lease_token = d.lease_token, .descriptor = EncodeKvLeaseDescriptor(d)};
    Post([this, pool, token = d.lease_token, ids = std::move(options.block_ids), on_done = std::move(on_done),
          on_released = std::move(options.on_released), num_layers = d.spec.num_layers]() mutable {
      const size_t pairs = static_cast<size_t>(num_layers) * ids.size();
      leases_[token] = Lease{.pool = pool, .block_ids = std::move(ids), .on_done = std::move(on_done),
                             .last_heard = Clock::now(), .taken = std::vector<bool>(pairs, false),
                             .verified = std::vector<bool>(pairs, false), .on_released = std::move(on_released)};
      num_leases_.store(static_cast<int64_t>(leases_.size()));
    });
    return grant;
  }

  void CloseLease(uint64_t token, absl::Status status) {
    Post([this, token, status = std::move(status)] {
      auto it = leases_.find(token);
      if (it == leases_.end()) return;
      // Tell a live sender to stop. Not one that is gone (Unavailable): UCX may already
      // have destroyed its reply endpoint, and a send there is a use after free; a
      // sender that is merely slow learns it from its next keepalive (kRefused).
      if (it->second.has_sender && it->second.reply_ep != nullptr && !absl::IsUnavailable(status)) {
        SendAnswer(it->second.reply_ep, kRefused, token, it->second.sender_push_id, status);
      }
      EndLease(token, status, {});
    });
  }

  // ---- Sender ----

  absl::StatusOr<std::shared_ptr<PushState>> OpenPush(KvPoolHandle pool, std::string_view descriptor) {
    auto st = std::make_shared<PushState>();
    KVMESH_ASSIGN_OR_RETURN(st->dest, DecodeKvLeaseDescriptor(descriptor));
    {
      std::lock_guard<std::mutex> lock(pools_mu_);
      if (pool.value < 0 || pool.value >= static_cast<int32_t>(pools_.size())) {
        return absl::InvalidArgumentError(absl::StrCat("OpenPush: unknown pool ", pool.value));
      }
      st->local_base = pools_[pool.value].base;
      st->local_layout = pools_[pool.value].layout;
    }
    KVMESH_RETURN_IF_ERROR(CheckKvBlockSpecsMatch(KvBlockSpecOf(*st->local_layout), st->dest.spec));
    // A receiver on this host, in this PID namespace, is written by cross-memory attach.
    if (cma_allowed_ && !cma_refused_.load() && st->dest.receiver_pid > 0 && SameHost(st->dest)) {
      st->cma_pid.store(st->dest.receiver_pid);
    }
    st->id = next_push_id_.fetch_add(1) + 1;
    st->sent.assign(static_cast<size_t>(st->dest.spec.num_layers) * st->dest.block_ids.size(), false);
    st->puts_per_layer.assign(static_cast<size_t>(st->dest.spec.num_layers), 0);
    st->start = Clock::now();
    absl::Status opened = RunSync([&] { return Connect(st); });
    KVMESH_RETURN_IF_ERROR(opened);
    // The receiver answers Hello with whether it knows the lease.
    std::unique_lock<std::mutex> lock(st->mu);
    const bool answered = st->cv.wait_for(lock, std::chrono::milliseconds(options_.ack_timeout_ms),
                                          [&] { return st->hello.has_value() || !st->error.ok(); });
    absl::Status result;
    if (!st->error.ok()) {
      result = st->error;
    } else if (!answered) {
      result = absl::UnavailableError(absl::StrCat("KV receiver did not answer within ", options_.ack_timeout_ms, " ms"));
    } else {
      result = *st->hello;
    }
    if (!result.ok()) {
      if (st->error.ok()) st->error = result;
      st->done = true;  // nothing was put: no on_done to run
      lock.unlock();
      // NOTE: synchronously, so that a refused OpenPush leaves nothing open behind it
      // (num_open_pushes() reads 0 as soon as it returns).
      RunSync([this, &st] { Retire(st); });
      return result;
    }
    return st;
  }

  absl::Status PutLayer(const std::shared_ptr<PushState>& st, int32_t layer, int32_t first_index,
                        std::span<const BlockId> src) {
    const int32_t n_lease = static_cast<int32_t>(st->dest.block_ids.size());
    const KvLayout& local = *st->local_layout;
    if (layer < 0 || layer >= st->dest.spec.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("PutLayer: layer ", layer, " outside [0, ", st->dest.spec.num_layers, ")"));
    }
    if (first_index < 0 || static_cast<int64_t>(first_index) + static_cast<int64_t>(src.size()) > n_lease) {
      return absl::InvalidArgumentError(absl::StrCat("PutLayer: blocks [", first_index, ", ", first_index + src.size(),
                                                     ") outside the lease's ", n_lease));
    }
    for (const BlockId id : src) {
      if (id.value < 0 || id.value >= local.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("PutLayer: local block ", id.value, " outside the pool"));
      }
    }
    std::span<const BlockId> dst(st->dest.block_ids.data() + first_index, src.size());
    std::vector<KvRun> runs = MergeKvRuns(src, dst);
    const int64_t block_bytes = local.BlockBytes();
    // What each run fills, and with checksum_runs what it holds (read here, while the
    // layer is in the cache): the receiver checks each run as it lands (VerifyRun).
    std::vector<RunChecksum> sums;
    for (const KvRun& r : runs) {
      sums.push_back(RunChecksum{.layer = layer, .first_index = first_index + r.first_index, .num_blocks = r.num_blocks,
                                 .checksum = options_.checksum_runs
                                                 ? Checksum({st->local_base + local.BlockOffset(layer, r.src_first),
                                                             static_cast<size_t>(r.num_blocks * block_bytes)})
                                                 : 0});
    }
    pid_t cma_pid = 0;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (!st->error.ok()) return st->error;
      if (st->finishing || st->cancelled) return absl::FailedPreconditionError("PutLayer after Finish or Cancel");
      const size_t base = static_cast<size_t>(layer) * n_lease + first_index;
      for (size_t i = 0; i < src.size(); ++i) {
        if (st->sent[base + i]) {
          return absl::InvalidArgumentError(absl::StrCat("PutLayer: layer ", layer, " block ", first_index + i, " already put"));
        }
      }
      for (size_t i = 0; i < src.size(); ++i) st->sent[base + i] = true;
      st->stats.blocks += static_cast<int64_t>(src.size());
      st->stats.bytes += static_cast<int64_t>(src.size()) * block_bytes;
      st->stats.descriptors += static_cast<int64_t>(runs.size());
      st->puts_per_layer[layer] += static_cast<int64_t>(runs.size());
      st->stats.runs = std::max<int64_t>(st->stats.runs, st->puts_per_layer[layer]);
      // NOTE: counted in the same section as the checks above, so that a Finish or a
      // failure that comes later waits for this call's writes (MaybeFlush, SendFence).
      cma_pid = st->cma_pid.load();
      if (cma_pid > 0) ++st->cma_writers;
    }
    if (cma_pid > 0) {
      // On the caller's thread, as the gRPC stream copies its chunks: a copy the
      // transport thread made would wait for a core while the model computes the next
      // layer (on a CPU worker every core is), and the last layers' backlog would land
      // after the prefill, as transfer tail.
      return WriteRunsByCma(st, cma_pid, layer, runs, std::move(sums));
    }
    Post([this, st, layer, runs = std::move(runs), sums = std::move(sums), block_bytes] {
      const KvLayout& local = *st->local_layout;
      for (size_t i = 0; i < runs.size(); ++i) {
        if (st->ep == nullptr || st->cancelled_on_worker) return;
        PostRun(st,
                RunHead{.lease_token = st->dest.lease_token, .push_id = st->id, .run = sums[i],
                        .checksummed = options_.checksum_runs ? 1u : 0u},
                st->local_base + local.BlockOffset(layer, runs[i].src_first),
                static_cast<size_t>(runs[i].num_blocks * block_bytes));
      }
    });
    return absl::OkStatus();
  }

  // PutLayer's writes by cross-memory attach of `runs` of `layer`, in order, on the
  // caller's thread; the caller counted itself in st->cma_writers, and this ends that.
  // The push's error when it ended meanwhile (the next write is not made); the write's
  // error otherwise, which fails the push. Aborted when the kernel refuses cross-memory
  // attach (ptrace policy, seccomp): this transport's later pushes to same-host
  // receivers then go as rendezvous runs, over an endpoint with peer-failure handling
  // (Peer), not this push's.
  absl::Status WriteRunsByCma(const std::shared_ptr<PushState>& st, pid_t pid, int32_t layer,
                              const std::vector<KvRun>& runs, std::vector<RunChecksum> sums) {
    const KvLayout& local = *st->local_layout;
    const int64_t block_bytes = local.BlockBytes();
    const uint64_t remote_layer_bytes = static_cast<uint64_t>(st->dest.pool_num_blocks) * block_bytes;
    int64_t written_blocks = 0;
    absl::Status error;
    for (size_t i = 0; i < runs.size(); ++i) {
      {
        // The push's generation check: a refused, failed or cancelled push writes
        // nothing more. (A write already past this check lands late: the receiver's
        // fence, writer_fence.h, keeps its blocks out of use until this call ends.)
        std::lock_guard<std::mutex> lock(st->mu);
        if (!st->error.ok() || st->cancelled) {
          error = st->error.ok() ? absl::CancelledError("the KV push was cancelled") : st->error;
          break;
        }
      }
      const KvRun& r = runs[i];
      const std::byte* src = st->local_base + local.BlockOffset(layer, r.src_first);
      const size_t bytes = static_cast<size_t>(r.num_blocks * block_bytes);
      const uint64_t dst = st->dest.remote_base + static_cast<uint64_t>(layer) * remote_layer_bytes +
                           static_cast<uint64_t>(r.dst_first.value) * block_bytes;
      const absl::Status written =
          options_.cma_write ? options_.cma_write(pid, src, bytes, dst) : CmaWrite(pid, src, bytes, dst);
      if (written.ok()) {
        written_blocks += r.num_blocks;
        continue;
      }
      error = written;
      if (absl::IsPermissionDenied(written)) {
        KVMESH_LOG(kWarning) << "cross-memory attach refused; later KV pushes go through UCX"
                             << LogKv("status", written.ToString());
        cma_refused_.store(true);
        error = absl::AbortedError(absl::StrCat("cross-memory attach refused: ", written.message()));
      }
      break;
    }
    bool waited_for = false;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->cma_blocks += written_blocks;
      // The last writer out: a Finish or a failure may have waited for it.
      waited_for = --st->cma_writers == 0 && (st->finishing || !st->error.ok() || st->cancelled);
    }
    if (!error.ok()) {
      Post([this, st, error] { Fail(st, error); });
      return error;
    }
    // The runs' checksums follow them (the receiver checks them now, not at the end: the
    // transfer's tail holds only the last layer's check), then whatever waited.
    if (!options_.checksum_runs) sums.clear();
    if (waited_for || !sums.empty()) {
      Post([this, st, sums = std::move(sums), waited_for] {
        if (!sums.empty() && st->ep != nullptr) {
          std::string body;
          Append(body, SumsBody{.num_runs = static_cast<uint32_t>(sums.size())});
          for (const RunChecksum& c : sums) Append(body, c);
          SendMsg(st->ep, kSums, MsgHead{st->dest.lease_token, st->id}, body);
        }
        if (!waited_for) return;
        MaybeFlush(st);
        SendFence(st);
      });
    }
    return absl::OkStatus();
  }

  void Finish(const std::shared_ptr<PushState>& st, KvPushDoneFn on_done) {
    {
      std::unique_lock<std::mutex> lock(st->mu);
      if (st->finishing) return;
      st->finishing = true;
      if (st->done) {  // already over (cancelled): report it now
        const absl::Status status = st->error;
        const KvTransferStats stats = st->stats;
        lock.unlock();
        on_done(status, stats);
        return;
      }
      st->on_done = std::move(on_done);
    }
    Post([this, st] { MaybeFlush(st); });
  }

  void Cancel(const std::shared_ptr<PushState>& st) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->done || st->cancelled) return;
      st->cancelled = true;
    }
    Post([this, st] {
      st->cancelled_on_worker = true;
      if (st->ep != nullptr) SendMsg(st->ep, kAbort, MsgHead{st->dest.lease_token, st->id}, {});
      Fail(st, absl::CancelledError("the KV push was cancelled"));
    });
  }

  int64_t num_open_leases() const { return num_leases_.load(); }
  int64_t num_open_pushes() const { return num_pushes_.load(); }
  int64_t num_fenced_leases() const { return num_fenced_.load(); }
  int64_t num_outstanding_requests() const { return num_requests_.load(); }

  std::vector<std::string> peer_transports() {
    return RunSync([this] {
      std::vector<std::string> out;
      for (const auto& [key, peer] : peers_) {
        if (peer.ep == nullptr) continue;
        for (std::string& t : EndpointTransports(peer.ep)) out.push_back(std::move(t));
      }
      return out;
    });
  }

 private:
  // ---- The worker thread ----

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    Wake();
  }

  // Runs `fn` on the worker thread and waits for it (inline when already there).
  template <typename Fn>
  auto RunSync(Fn fn) -> decltype(fn()) {
    if (std::this_thread::get_id() == thread_.get_id()) return fn();
    std::packaged_task<decltype(fn())()> task(std::move(fn));
    auto future = task.get_future();
    Post([&task] { task(); });
    return future.get();
  }

  void Wake() {
    const uint64_t one = 1;
    (void)!write(task_efd_, &one, sizeof(one));
  }

  // Sleeps until UCX has an event, a task was posted, or `timeout_ms` passed.
  void Sleep(int timeout_ms) {
    if (worker_efd_ >= 0) {
      const ucs_status_t armed = ucp_worker_arm(worker_);
      if (armed == UCS_ERR_BUSY) return;  // events already pending: progress them
    }
    pollfd fds[2] = {{.fd = task_efd_, .events = POLLIN, .revents = 0}, {.fd = worker_efd_, .events = POLLIN, .revents = 0}};
    (void)poll(fds, worker_efd_ >= 0 ? 2 : 1, timeout_ms);
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)!read(task_efd_, &n, sizeof(n));
    }
  }

  void Loop() {
    Clock::time_point last_busy = Clock::now();
    Clock::time_point last_timers = last_busy;
    while (true) {
      std::deque<std::function<void()>> tasks;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        tasks.swap(tasks_);
      }
      bool busy = !tasks.empty();
      for (auto& t : tasks) t();
      int events = 0;
      while (ucp_worker_progress(worker_) != 0 && events < 1024) ++events;
      busy = busy || events > 0 || inflight_ > 0;
      const Clock::time_point now = Clock::now();
      if (now - last_timers >= std::chrono::milliseconds(1)) {
        last_timers = now;
        CheckTimers(now);
      }
      if (busy) {
        last_busy = now;
        continue;
      }
      // Spin a little after activity (the next put or message is usually close), then
      // sleep in short steps: the receiver of a tcp put must progress to land it.
      if (now - last_busy < std::chrono::milliseconds(2)) {
        sched_yield();
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || !tasks_.empty()) continue;
      }
      // 1 ms: the timers' resolution.
      Sleep(1);
    }
  }

  void CheckTimers(Clock::time_point now) {
    ReapClosed();
    // Receiver: fenced leases whose writer's process is gone (a poll of each pidfd).
    if (fences_.size() > 0 && now - last_fence_check_ >= std::chrono::milliseconds(10)) {
      last_fence_check_ = now;
      Released(fences_.ReleaseGone());
    }
    // Receiver: leases whose sender went quiet.
    std::vector<uint64_t> expired;
    for (const auto& [token, lease] : leases_) {
      // Before the Hello the control plane's deadline owns the lease (the sender may be
      // queued, or may push another way), unless hello_timeout_ms says otherwise.
      const int64_t limit = lease.has_sender ? options_.progress_timeout_ms : options_.hello_timeout_ms;
      if (limit > 0 && MsSince(lease.last_heard, now) > limit) expired.push_back(token);
    }
    for (const uint64_t token : expired) {
      const bool had_sender = leases_[token].has_sender;
      EndLease(token,
               absl::DeadlineExceededError(absl::StrCat(
                   had_sender ? "the KV sender went quiet: no message for " : "no KV sender arrived within ",
                   had_sender ? options_.progress_timeout_ms : options_.hello_timeout_ms, " ms")),
               {});
    }
    // Sender: keepalives and answers that did not come.
    std::vector<std::shared_ptr<PushState>> pushes;
    for (const auto& [id, st] : pushes_) pushes.push_back(st);
    for (const auto& st : pushes) {
      if (st->ep == nullptr) continue;
      // A receiver that stops answering (dead on shm, where UCX cannot tell, or
      // stopped) loses its endpoint: its puts are cancelled and the push ends, so the
      // sender's caller unpins the source blocks within the deadline.
      if (st->done_sent) {
        if (now > st->ack_deadline) {
          LosePeer(st->peer_key, absl::UnavailableError(absl::StrCat(
                                     "the KV receiver did not acknowledge the completion within ",
                                     options_.ack_timeout_ms, " ms")));
        }
        continue;
      }
      if (MsSince(st->last_heard_receiver, now) > options_.receiver_timeout_ms) {
        LosePeer(st->peer_key, absl::UnavailableError(absl::StrCat("the KV receiver went quiet: no answer for ",
                                                                   options_.receiver_timeout_ms, " ms")));
        continue;
      }
      if (MsSince(st->last_keepalive, now) >= options_.keepalive_interval_ms) {
        st->last_keepalive = now;
        SendMsg(st->ep, kProgress, MsgHead{st->dest.lease_token, st->id}, {});
      }
    }
  }

  // The "tl/device" of each of `ep`'s lanes. NOTE: UCX 1.13 has no query for an
  // endpoint's transports (ucp_ep_query's came in 1.14): its printed description is read.
  static std::vector<std::string> EndpointTransports(ucp_ep_h ep) {
    char* text = nullptr;
    size_t size = 0;
    FILE* stream = open_memstream(&text, &size);
    if (stream == nullptr) return {};
    ucp_ep_print_info(ep, stream);
    std::fclose(stream);
    std::vector<std::string> out;
    // A lane reads "lane[0]:  1:tcp/eth0.0 md[1] -> ...": its transport follows "N:".
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
      const size_t lane = line.find("lane[");
      if (lane == absl::string_view::npos) continue;
      const size_t colon = line.find(':', line.find(':', lane) + 1);
      if (colon == absl::string_view::npos) continue;
      absl::string_view tl = line.substr(colon + 1);
      tl = tl.substr(0, tl.find(' '));
      if (const size_t dot = tl.rfind('.'); dot != absl::string_view::npos) tl = tl.substr(0, dot);
      out.emplace_back(tl);
    }
    std::free(text);
    return out;
  }

  // Whether the receiver of `dest` runs on this host, in this PID namespace.
  bool SameHost(const KvLeaseDescriptor& dest) const {
    return !host_identity_.empty() && dest.host_identity == host_identity_;
  }

  // The connection to the receiver of `dest` for a push that writes its runs by
  // cross-memory attach (`direct`) or sends them: made now if there is none (or the
  // last one failed: the receiver may have restarted). Sets `*key` to its peers_ key.
  // InvalidArgument when UCX refuses the receiver's worker address.
  absl::StatusOr<ucp_ep_h> PeerEndpoint(const KvLeaseDescriptor& dest, bool direct, std::string* key) {
    // NOTE: UCX 1.13's shared-memory active-message transports (posix, sysv) have no
    // peer failure handling: an endpoint that asks for it gets tcp, over any device with
    // an address (same_host.h). So a receiver on this host that this push writes by
    // cross-memory attach is reached without it, over shared memory (only control
    // messages go there), as is any receiver when UCX refuses it (UCX_TLS=sm; tried
    // once: UCX logs the refusal). A dead or stopped receiver then shows as its missing
    // ProgressAcks (receiver_timeout_ms) or DoneAck (ack_timeout_ms), and LosePeer
    // closes the endpoint. Runs go over shared memory only when nothing else can carry
    // them (Peer::peer_failure_handling).
    const bool over_shm = shm_allowed_ && SameHost(dest) && (direct || !peer_mode_usable_);
    *key = absl::StrCat(over_shm ? "shm:" : "", dest.worker_address);
    if (const auto it = peers_.find(*key); it != peers_.end() && it->second.failed) peers_.erase(it);
    Peer& peer = peers_[*key];
    if (peer.ep != nullptr) return peer.ep;
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(dest.worker_address.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = &Impl::OnEpError;
    ep_params.err_handler.arg = this;
    ucs_status_t s = UCS_ERR_UNREACHABLE;
    if (peer_mode_usable_ && !over_shm) {
      s = ucp_ep_create(worker_, &ep_params, &peer.ep);
      if (s == UCS_ERR_UNREACHABLE) peer_mode_usable_ = false;
      peer.peer_failure_handling = s == UCS_OK;
    }
    if (s == UCS_ERR_UNREACHABLE) {
      ep_params.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
      s = ucp_ep_create(worker_, &ep_params, &peer.ep);
    }
    if (s != UCS_OK) {
      peers_.erase(*key);
      return absl::InvalidArgumentError(absl::StrCat("lease descriptor: worker address refused by UCX: ",
                                                     ucs_status_string(s)));
    }
    KVMESH_LOG(kInfo) << "connected to a KV receiver"
                      << LogKv("transports", absl::StrJoin(EndpointTransports(peer.ep), ","))
                      << LogKv("same_host", SameHost(dest));
    return peer.ep;
  }

  absl::Status Connect(const std::shared_ptr<PushState>& st) {
    KVMESH_ASSIGN_OR_RETURN(const ucp_ep_h ep, PeerEndpoint(st->dest, st->cma_pid.load() > 0, &st->peer_key));
    // NOTE: UCX 1.13's ucp_ep_rkey_unpack crashes on some garbage (its error path
    // releases keys it never unpacked), so the shape of a packed key is checked first:
    // a 64-bit memory-domain map, a memory type, then at least a size byte per domain.
    // The descriptor's checksum is what catches corruption; this catches a well-framed
    // key that cannot be UCX's.
    const std::string& key = st->dest.remote_key;
    uint64_t md_map = 0;
    if (key.size() >= sizeof(md_map)) std::memcpy(&md_map, key.data(), sizeof(md_map));
    if (key.size() < sizeof(md_map) + 1 || md_map == 0 ||
        static_cast<size_t>(__builtin_popcountll(md_map)) > key.size() - sizeof(md_map) - 1) {
      return absl::InvalidArgumentError(absl::StrCat("lease descriptor: a remote key of ", key.size(),
                                                     " bytes is not a packed UCX key"));
    }
    const ucs_status_t s = ucp_ep_rkey_unpack(ep, key.data(), &st->rkey);
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(absl::StrCat("lease descriptor: remote key refused by UCX: ", ucs_status_string(s)));
    }
    st->ep = ep;
    st->last_keepalive = Clock::now();
    st->last_heard_receiver = st->last_keepalive;
    pushes_[st->id] = st;
    num_pushes_.store(static_cast<int64_t>(pushes_.size()));
    // Who writes: a push by cross-memory attach names this process, which the receiver
    // then watches (writer_fence.h).
    const bool direct = st->cma_pid.load() > 0;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->announced_direct = direct;
    }
    std::string hello;
    Append(hello, HelloBody{.writer_pid = direct ? static_cast<int32_t>(::getpid()) : 0,
                            .flags = direct ? kWritesDirectly : 0u});
    SendMsg(st->ep, kHello, MsgHead{st->dest.lease_token, st->id}, hello);
    return absl::OkStatus();
  }

  struct OpContext {
    Impl* impl;
    std::shared_ptr<PushState> st;
    RunHead head{};  // a run's header, alive until its send completes
  };

  // One merged run as an active message in rendezvous: the receiver checks it against
  // its lease and has UCX move the bytes straight into its pool (cma get on one host,
  // tcp zero-copy sends across hosts). NOTE: not ucp_put_nbx: UCX 1.13 emulates a put
  // into registered memory over tcp and shm with eager fragments (cma_put.h), at a
  // fraction of what the link carries.
  void PostRun(const std::shared_ptr<PushState>& st, const RunHead& head, const std::byte* local, size_t bytes) {
    ucp_request_param_t p{};
    auto* ctx = new OpContext{this, st, head};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_RNDV;
    p.cb.send = &Impl::OnOpDone;
    p.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_send_nbx(st->ep, kRun, &ctx->head, sizeof(ctx->head), local, bytes, &p);
    TrackOp(ctx, r, "ucp_am_send_nbx");
  }

  // A run's or flush's request: completed now, failed now, or in flight.
  void TrackOp(OpContext* ctx, ucs_status_ptr_t r, const char* what) {
    if (r == nullptr) {
      delete ctx;
      return;
    }
    if (UCS_PTR_IS_ERR(r)) {
      Fail(ctx->st, absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(UCS_PTR_STATUS(r)))));
      delete ctx;
      return;
    }
    ++ctx->st->inflight;
    ++inflight_;
    Posted();
  }

  static void OnOpDone(void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<OpContext*>(user_data);
    Impl* self = ctx->impl;
    if (!ctx->st->abandoned) {  // LosePeer already stopped counting it
      --ctx->st->inflight;
      --self->inflight_;
    }
    if (status != UCS_OK) {
      self->Fail(ctx->st, absl::UnavailableError(absl::StrCat("sending KV to the receiver failed: ", ucs_status_string(status))));
    }
    const std::shared_ptr<PushState> st = std::move(ctx->st);
    delete ctx;
    self->Free(request);
    self->MaybeFlush(st);
  }

  // Once Finish was called and every run completed: flush the endpoint, then (in the
  // flush's callback) send Done.
  void MaybeFlush(const std::shared_ptr<PushState>& st) {
    bool finishing;
    bool failed;
    bool writing;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      finishing = st->finishing && !st->done;
      failed = !st->error.ok();
      writing = st->cma_writers > 0;
    }
    if (failed || st->ep == nullptr) return Complete(st);
    if (!finishing) return;
    // NOTE: writes by cross-memory attach are complete when they return; a flush would
    // only wait for the receiver to drain its shm FIFO (0.4-3 ms measured in the dev
    // cluster, the transfer tail).
    if (!st->flush_posted && st->cma_pid.load() == 0) {
      st->flush_posted = true;
      ucp_request_param_t p{};
      auto* ctx = new OpContext{this, st};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = &Impl::OnOpDone;
      p.user_data = ctx;
      TrackOp(ctx, ucp_ep_flush_nbx(st->ep, &p), "ucp_ep_flush_nbx");
    }
    // NOTE: nor while a PutLayer is inside its writes by cross-memory attach: the Done
    // tells the receiver that nothing of this push can land any more.
    if (st->inflight > 0 || writing || st->done_sent || st->ep == nullptr) return;
    // Every put is remotely complete: the completion may go.
    std::string body;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->done) return;
      // NOTE: no checksums: every run's went with it (RunHead) or after it (Sums).
      Append(body, DoneBody{.blocks = st->stats.blocks, .bytes = st->stats.bytes, .cma_blocks = st->cma_blocks,
                            .num_checksums = 0});
    }
    st->done_sent = true;
    st->ack_deadline = Clock::now() + std::chrono::milliseconds(options_.ack_timeout_ms);
    SendMsg(st->ep, kDone, MsgHead{st->dest.lease_token, st->id}, body);
  }

  // Ends a push with `status` (its first error wins); on_done runs once nothing is in
  // flight any more (the caller unpins the source blocks in it).
  void Fail(const std::shared_ptr<PushState>& st, const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->error.ok()) st->error = status;
    }
    st->cv.notify_all();
    Complete(st);
    // NOTE: not only from Complete: a push that failed waits there for its Finish, and
    // its receiver's blocks need not wait for that.
    SendFence(st);
  }

  // Runs on_done when the push ended (an error, or the DoneAck) and no put is in
  // flight; a cancelled push nobody finishes is forgotten then.
  void Complete(const std::shared_ptr<PushState>& st) {
    KvPushDoneFn done;
    absl::Status status;
    KvTransferStats stats;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->done) return;
      const bool ended = !st->error.ok() || st->done_answer.has_value();
      if (!ended || (st->inflight > 0 && !st->abandoned)) return;
      if (st->on_done == nullptr && !st->cancelled) return;  // Finish will come and report it
      st->done = true;
      status = st->error.ok() ? *st->done_answer : st->error;
      st->stats.seconds = std::chrono::duration<double>(Clock::now() - st->start).count();
      stats = st->stats;
      done = std::move(st->on_done);
    }
    Retire(st);
    SendFence(st);
    if (done) done(status, stats);
  }

  // Tells the receiver of a failed push that wrote by cross-memory attach that none of
  // its writes can land any more (Fenced), once none is running: the blocks of its
  // lease may then be reused (writer_fence.h). Once; over a new endpoint when the old
  // one was lost (the receiver may be alive: it may have failed the lease itself).
  void SendFence(const std::shared_ptr<PushState>& st) {
    if (st->fence_sent) return;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (!st->announced_direct || st->error.ok() || st->cma_writers > 0) return;
    }
    st->fence_sent = true;
    std::string key;
    const absl::StatusOr<ucp_ep_h> ep = PeerEndpoint(st->dest, /*direct=*/true, &key);
    // Unreachable: the receiver releases the fence when it sees this process gone.
    if (!ep.ok()) return;
    SendMsg(*ep, kFenced, MsgHead{st->dest.lease_token, st->id}, {});
  }

  // Forgets a finished push (worker thread).
  void Retire(const std::shared_ptr<PushState>& st) {
    if (st->rkey != nullptr) {
      ucp_rkey_destroy(st->rkey);
      st->rkey = nullptr;
    }
    st->ep = nullptr;
    pushes_.erase(st->id);
    num_pushes_.store(static_cast<int64_t>(pushes_.size()));
  }

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    const absl::Status error = absl::UnavailableError(absl::StrCat("the KV peer was lost: ", ucs_status_string(status)));
    std::string key;
    for (auto& [k, peer] : self->peers_) {
      if (peer.ep == ep) key = k;
    }
    // A receiver-side reply endpoint (not one of ours): UCX cleans it up.
    if (key.empty()) return;
    // NOTE: the endpoint is closed from the loop, not inside UCX's callback.
    self->Post([self, key, error] { self->LosePeer(key, error); });
  }

  // The peer at `key` is gone (its endpoint failed, or it stopped answering): every push
  // to it fails with `error`, its endpoint is force-closed (UCX cancels what is still
  // queued on it, so nothing more is written), and the next push reconnects.
  void LosePeer(const std::string& key, const absl::Status& error) {
    auto it = peers_.find(key);
    if (it == peers_.end() || it->second.ep == nullptr) return;
    const ucp_ep_h ep = it->second.ep;
    it->second.failed = true;
    it->second.error = error;
    it->second.ep = nullptr;
    const bool forced = it->second.peer_failure_handling;
    std::vector<std::shared_ptr<PushState>> hit;
    for (const auto& [id, st] : pushes_) {
      if (st->ep == ep) hit.push_back(st);
    }
    for (const auto& st : hit) {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->error.ok()) st->error = error;
    }
    CloseEndpoint(ep, forced);
    for (const auto& st : hit) {
      // Whatever the close did not complete will never write: stop waiting for it.
      st->abandoned = true;
      inflight_ -= st->inflight;
      st->inflight = 0;
      if (st->rkey != nullptr) {
        ucp_rkey_destroy(st->rkey);
        st->rkey = nullptr;
      }
      st->ep = nullptr;
      st->cv.notify_all();
      Complete(st);
    }
  }

  // Closes `ep` for good. With peer-failure handling, by force: UCX completes whatever
  // is still queued on it (UCS_ERR_CANCELED), so every request comes back through its
  // callback. Without it, by flushing, the only close UCX allows there (Peer): that
  // close completes once the receiver took what was queued, and its request is kept
  // (counted outstanding) until then (CheckTimers); runs never go there unless UCX_TLS
  // left nothing else, so a dead receiver strands at most its control messages.
  void CloseEndpoint(ucp_ep_h ep, bool forced) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = forced ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r == nullptr) return;
    if (UCS_PTR_IS_ERR(r)) {
      KVMESH_LOG(kWarning) << "closing a KV endpoint failed" << LogKv("status", ucs_status_string(UCS_PTR_STATUS(r)));
      return;
    }
    if (forced) {
      const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(100);
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
      ucp_request_free(r);
      return;
    }
    Posted();
    closing_.push_back(r);
  }

  // Returns the flushing closes that completed.
  void ReapClosed() {
    std::erase_if(closing_, [this](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      Free(r);
      return true;
    });
  }

  // ---- UCX requests ----
  // Every request UCX hands back in progress (a send, flush, receive or flushing close)
  // is counted until it is returned (ucp_request_free): num_outstanding_requests().

  void Posted() { num_requests_.store(++requests_); }

  void Free(void* request) {
    ucp_request_free(request);
    num_requests_.store(--requests_);
  }

  // ---- Messages ----

  struct SendContext {
    Impl* impl;
    std::string bytes;
  };

  void SendMsg(ucp_ep_h ep, unsigned id, const MsgHead& head, std::string_view body) {
    auto* ctx = new SendContext{this, {}};
    Append(ctx->bytes, head);
    ctx->bytes.append(body);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      auto* ctx = static_cast<SendContext*>(user_data);
      Impl* self = ctx->impl;
      delete ctx;
      self->Free(request);
    };
    p.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, ctx->bytes.data(), ctx->bytes.size(), &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      delete ctx;  // sent, or failed: the endpoint's error handler reports it
      return;
    }
    Posted();
  }

  void SendAnswer(ucp_ep_h ep, unsigned id, uint64_t token, uint64_t push_id, const absl::Status& status) {
    if (ep == nullptr) return;
    std::string body;
    const std::string_view message = ToStd(status.message());
    Append(body, AnswerBody{.code = static_cast<int32_t>(status.code()),
                            .message_bytes = static_cast<uint32_t>(message.size())});
    body.append(message);
    SendMsg(ep, id, MsgHead{token, push_id}, body);
  }

  static absl::Status ReadAnswer(std::string_view in) {
    AnswerBody a{};
    if (!Take(in, a) || in.size() < a.message_bytes) return absl::InternalError("malformed answer from the KV peer");
    const int32_t code = std::clamp<int32_t>(a.code, 0, 16);
    return absl::Status(static_cast<absl::StatusCode>(code), ToAbsl(in.substr(0, a.message_bytes)));
  }

  struct AmArg {
    Impl* impl = nullptr;
    unsigned id = 0;
  };

  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
    const auto* a = static_cast<const AmArg*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;  // we send eager only
    std::string_view in(static_cast<const char*>(data), length);
    MsgHead head{};
    if (!Take(in, head)) return UCS_OK;
    const ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
    // NOTE: answers go out from the loop, not from inside UCX's callback.
    std::string body(in);
    a->impl->Post([impl = a->impl, id = a->id, head, body = std::move(body), reply] {
      impl->OnMessage(id, head, body, reply);
    });
    return UCS_OK;
  }

  void OnMessage(unsigned id, const MsgHead& head, std::string_view body, ucp_ep_h reply) {
    switch (id) {
      case kHello:
      case kProgress:
      case kDone:
      case kAbort:
      case kFenced:
      case kSums:
        return OnReceiverMessage(id, head, body, reply);
      default:
        break;
    }
    auto it = pushes_.find(head.push_id);
    if (it == pushes_.end()) return;
    const std::shared_ptr<PushState> st = it->second;
    st->last_heard_receiver = Clock::now();
    if (id == kProgressAck) return;
    const absl::Status answer = ReadAnswer(body);
    if (id == kHelloAck) {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->hello = answer;
      }
      st->cv.notify_all();
    } else if (id == kDoneAck) {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->done_answer = answer;
      }
      Complete(st);
    } else if (id == kRefused) {
      Fail(st, answer);
    }
  }

  void OnReceiverMessage(unsigned id, const MsgHead& head, std::string_view body, ucp_ep_h reply) {
    auto it = leases_.find(head.lease_token);
    if (it == leases_.end()) {
      // The writer of a fenced lease says it writes no more: its blocks are free now.
      if (id == kFenced || id == kDone) {
        if (std::optional<KvLeaseReleasedFn> released = fences_.Acknowledge(head.lease_token, head.push_id)) {
          Released({*std::move(released)});
        }
      }
      const absl::Status unknown = absl::NotFoundError(
          absl::StrCat("KV lease ", head.lease_token, " is not open here (never granted, expired or closed)"));
      if (id == kHello) SendAnswer(reply, kHelloAck, head.lease_token, head.push_id, unknown);
      if (id == kProgress) SendAnswer(reply, kRefused, head.lease_token, head.push_id, unknown);
      if (id == kDone) SendAnswer(reply, kDoneAck, head.lease_token, head.push_id, unknown);
      return;
    }
    Lease& lease = it->second;
    if (id == kHello) {
      if (lease.has_sender && lease.sender_push_id != head.push_id) {
        return SendAnswer(reply, kHelloAck, head.lease_token, head.push_id,
                          absl::FailedPreconditionError("KV lease already has a sender"));
      }
      lease.has_sender = true;
      lease.sender_push_id = head.push_id;
      lease.reply_ep = reply;
      lease.last_heard = Clock::now();
      // A sender that does not say who writes (no HelloBody) is taken to write directly
      // wherever this lease offered it (an unknown process: only its word releases it).
      HelloBody hello{};
      if (!Take(body, hello)) hello = HelloBody{.writer_pid = 0, .flags = cma_allowed_ ? kWritesDirectly : 0u};
      if ((hello.flags & kWritesDirectly) != 0) lease.direct_writer = WriterProcess::Open(hello.writer_pid);
      return SendAnswer(reply, kHelloAck, head.lease_token, head.push_id, absl::OkStatus());
    }
    if (!lease.has_sender || lease.sender_push_id != head.push_id) {
      return SendAnswer(reply, kRefused, head.lease_token, head.push_id,
                        absl::FailedPreconditionError("KV lease belongs to another sender"));
    }
    lease.last_heard = Clock::now();
    if (id == kProgress) return SendAnswer(reply, kProgressAck, head.lease_token, head.push_id, absl::OkStatus());
    if (id == kAbort) {
      EndLease(head.lease_token, absl::AbortedError("the KV sender abandoned the transfer"), {});
      return;
    }
    if (id == kSums) {
      // The checksums of runs the sender wrote directly and that have landed.
      SumsBody sums{};
      absl::Status verified = Take(body, sums) ? absl::OkStatus() : absl::DataLossError("malformed KV checksums");
      for (uint32_t i = 0; i < sums.num_runs && verified.ok(); ++i) {
        RunChecksum c{};
        verified = Take(body, c) ? VerifyRun(lease, c) : absl::DataLossError("malformed KV checksums");
      }
      if (!verified.ok()) {
        SendAnswer(reply, kRefused, head.lease_token, head.push_id, verified);
        EndLease(head.lease_token, verified, {});
      }
      return;
    }
    // Fenced and Done: the sender sends either only once none of its writes can land.
    lease.writer_stopped = true;
    if (id == kFenced) {
      EndLease(head.lease_token, absl::AbortedError("the KV sender's push failed"), {});
      return;
    }
    // NOTE: over tcp UCX spreads a run's bytes over several connections, so the Done
    // may overtake the last runs: it is answered once they have landed (or the lease
    // times out waiting for them).
    lease.pending_done = std::string(body);
    MaybeAnswerDone(head.lease_token, lease);
  }

  // Answers a pending Done once every run it counts has landed.
  void MaybeAnswerDone(uint64_t token, Lease& lease) {
    if (!lease.pending_done.has_value() || lease.runs_in_flight > 0) return;
    std::string_view in = *lease.pending_done;
    DoneBody d{};
    if (Take(in, d) && d.blocks >= 0 && d.cma_blocks >= 0 && lease.num_landed + d.cma_blocks < d.blocks) return;
    const std::string body = *std::move(lease.pending_done);
    lease.pending_done.reset();
    AnswerDone(token, lease, body);
  }

  void AnswerDone(uint64_t token, Lease& lease, std::string_view body) {
    KvTransferStats stats;
    const absl::Status verdict = CheckDone(lease, body, stats);
    const ucp_ep_h reply = lease.reply_ep;
    const uint64_t push_id = lease.sender_push_id;
    EndLease(token, verdict, stats);
    SendAnswer(reply, kDoneAck, token, push_id, verdict);
  }

  // ---- Receiver: a run's data (worker thread, inside ucp_worker_progress) ----

  struct RunRecv {
    Impl* impl;
    uint64_t lease_token;
    RunChecksum run;
    bool checksummed;
  };

  static ucs_status_t OnRunAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->OnRun(header, header_length, data, length, param);
  }

  // NOTE: a refused run is dropped (UCX releases its data) and fails the lease: a sender
  // that writes outside its lease is not to be trusted with the rest of it.
  ucs_status_t OnRun(const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
    RunHead h{};
    if (header_length != sizeof(h)) return UCS_OK;
    std::memcpy(&h, header, sizeof(h));
    auto it = leases_.find(h.lease_token);
    if (it == leases_.end()) return UCS_OK;  // ended: the sender learns it from its next message
    Lease& lease = it->second;
    const absl::Status checked = CheckRun(lease, h, length);
    if (!checked.ok()) {
      const ucp_ep_h reply = lease.has_sender ? lease.reply_ep : nullptr;
      const uint64_t push_id = lease.sender_push_id;
      const uint64_t token = h.lease_token;
      // NOTE: answered from the loop, not from inside UCX's callback.
      Post([this, token, push_id, reply, checked] {
        if (reply != nullptr) SendAnswer(reply, kRefused, token, push_id, checked);
        EndLease(token, checked, {});
      });
      return UCS_OK;
    }
    lease.last_heard = Clock::now();
    std::byte* dst = nullptr;
    {
      std::lock_guard<std::mutex> lock(pools_mu_);  // pools are never removed, but the table may grow
      const Pool& pool = pools_[lease.pool.value];
      dst = pool.base + pool.layout.BlockOffset(h.run.layer, lease.block_ids[h.run.first_index]);
    }
    const size_t n = static_cast<size_t>(lease.block_ids.size());
    for (int32_t k = 0; k < h.run.num_blocks; ++k) {
      lease.taken[static_cast<size_t>(h.run.layer) * n + h.run.first_index + k] = true;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      std::memcpy(dst, data, length);  // small enough to come eagerly
      CountLanded(lease, h.run, h.checksummed != 0);
      // NOTE: from the loop: a Done it completes is answered outside UCX's callback.
      Post([this, token = h.lease_token] { AfterLastRun(token); });
      return UCS_OK;
    }
    ucp_request_param_t p{};
    auto* ctx = new RunRecv{this, h.lease_token, h.run, h.checksummed != 0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &Impl::OnRunLanded;
    p.user_data = ctx;
    ++lease.runs_in_flight;
    ++inflight_;  // the loop keeps progressing (no sleep) while UCX receives
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, data, dst, length, &p);
    if (r == nullptr) {
      Landed(ctx, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      Landed(ctx, UCS_PTR_STATUS(r));
    } else {
      Posted();
    }
    return UCS_OK;
  }

  absl::Status CheckRun(const Lease& lease, const RunHead& h, size_t length) {
    if (lease.ending.has_value()) return absl::FailedPreconditionError("KV lease is ending");
    if (!lease.has_sender || lease.sender_push_id != h.push_id) {
      return absl::FailedPreconditionError("KV run from a sender the lease did not accept");
    }
    std::lock_guard<std::mutex> lock(pools_mu_);
    const KvLayout& layout = pools_[lease.pool.value].layout;
    const int64_t n = static_cast<int64_t>(lease.block_ids.size());
    const RunChecksum& run = h.run;
    if (run.layer < 0 || run.layer >= layout.num_layers() || run.first_index < 0 || run.num_blocks <= 0 ||
        static_cast<int64_t>(run.first_index) + run.num_blocks > n) {
      return absl::InvalidArgumentError(absl::StrCat("KV run layer ", run.layer, " blocks [", run.first_index, ", +",
                                                     run.num_blocks, ") is outside the lease"));
    }
    if (static_cast<int64_t>(length) != run.num_blocks * layout.BlockBytes()) {
      return absl::InvalidArgumentError(absl::StrCat("KV run of ", length, " bytes for ", run.num_blocks, " blocks"));
    }
    for (int32_t k = 0; k < run.num_blocks; ++k) {
      if (k > 0 && lease.block_ids[run.first_index + k].value != lease.block_ids[run.first_index].value + k) {
        return absl::InvalidArgumentError("KV run is not contiguous in the receiver's pool");
      }
      if (lease.taken[static_cast<size_t>(run.layer) * static_cast<size_t>(n) + run.first_index + k]) {
        return absl::InvalidArgumentError(absl::StrCat("KV run repeats layer ", run.layer, " block ", run.first_index + k));
      }
    }
    return absl::OkStatus();
  }

  static void OnRunLanded(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* ctx = static_cast<RunRecv*>(user_data);
    Impl* self = ctx->impl;
    self->Free(request);
    self->Landed(ctx, status);
  }

  // A run's bytes are in the pool (or failed to come): count them, then finish what
  // waited for them (a Done, or the lease's end).
  void Landed(RunRecv* ctx, ucs_status_t status) {
    const uint64_t token = ctx->lease_token;
    const RunChecksum run = ctx->run;
    const bool checksummed = ctx->checksummed;
    delete ctx;
    --inflight_;
    auto it = leases_.find(token);
    if (it == leases_.end()) return;
    Lease& lease = it->second;
    --lease.runs_in_flight;
    if (status == UCS_OK) {
      CountLanded(lease, run, checksummed);
    } else if (!lease.ending.has_value()) {
      lease.ending.emplace(absl::UnavailableError(absl::StrCat("receiving a KV run failed: ", ucs_status_string(status))),
                           KvTransferStats{});
    }
    // NOTE: from the loop: what it ends or answers runs outside UCX's callback.
    if (lease.runs_in_flight == 0) Post([this, token] { AfterLastRun(token); });
  }

  // A run's bytes are in the pool: counted, and checked against its checksum when it
  // came with one (a mismatch ends the lease once no run lands any more).
  void CountLanded(Lease& lease, const RunChecksum& run, bool checksummed) {
    lease.num_landed += run.num_blocks;
    if (!checksummed) return;
    const absl::Status verified = VerifyRun(lease, run);
    if (!verified.ok() && !lease.ending.has_value()) lease.ending.emplace(verified, KvTransferStats{});
  }

  // Checks one run's bytes in the pool against `c` and records its (layer, block) pairs
  // as verified. DataLoss for a run outside the lease, not contiguous here, or holding
  // other bytes.
  absl::Status VerifyRun(Lease& lease, const RunChecksum& c) {
    const Pool* pool;
    {
      std::lock_guard<std::mutex> lock(pools_mu_);
      pool = &pools_[lease.pool.value];
    }
    const KvLayout& layout = pool->layout;
    const int64_t n_lease = static_cast<int64_t>(lease.block_ids.size());
    if (c.layer < 0 || c.layer >= layout.num_layers() || c.first_index < 0 || c.num_blocks <= 0 ||
        static_cast<int64_t>(c.first_index) + c.num_blocks > n_lease) {
      return absl::DataLossError("KV checksum of a run outside the lease");
    }
    for (int32_t k = 1; k < c.num_blocks; ++k) {
      if (lease.block_ids[c.first_index + k].value != lease.block_ids[c.first_index].value + k) {
        return absl::DataLossError("KV checksum of a run that is not contiguous here");
      }
    }
    const std::byte* at = pool->base + layout.BlockOffset(c.layer, lease.block_ids[c.first_index]);
    if (Checksum({at, static_cast<size_t>(c.num_blocks * layout.BlockBytes())}) != c.checksum) {
      return absl::DataLossError(absl::StrCat("KV run layer ", c.layer, " blocks [", c.first_index, ", ",
                                              c.first_index + c.num_blocks, ") landed with a different checksum"));
    }
    for (int32_t k = 0; k < c.num_blocks; ++k) {
      const size_t pair = static_cast<size_t>(c.layer) * static_cast<size_t>(n_lease) + c.first_index + k;
      if (!lease.verified[pair]) {
        lease.verified[pair] = true;
        ++lease.num_verified;
      }
    }
    return absl::OkStatus();
  }

  // No run of the lease is landing any more: the end it deferred, or a Done it held.
  void AfterLastRun(uint64_t token) {
    auto it = leases_.find(token);
    if (it == leases_.end() || it->second.runs_in_flight > 0) return;
    Lease& lease = it->second;
    if (lease.ending.has_value()) {
      auto [why, stats] = *lease.ending;
      lease.ending.reset();
      return EndLease(token, why, stats);
    }
    MaybeAnswerDone(token, lease);
  }

  // The completion's claims against the lease: every (layer, block) put once (the
  // sender refuses repeats), and with checksums, the bytes that landed.
  absl::Status CheckDone(Lease& lease, std::string_view in, KvTransferStats& stats) {
    DoneBody d{};
    if (!Take(in, d)) return absl::DataLossError("malformed KV completion");
    const Pool* pool;
    {
      std::lock_guard<std::mutex> lock(pools_mu_);
      pool = &pools_[lease.pool.value];
    }
    const KvLayout& layout = pool->layout;
    const int64_t expected = static_cast<int64_t>(layout.num_layers()) * static_cast<int64_t>(lease.block_ids.size());
    stats.blocks = d.blocks;
    stats.bytes = d.bytes;
    if (d.blocks != expected || d.bytes != expected * layout.BlockBytes()) {
      return absl::DataLossError(absl::StrCat("the KV sender put ", d.blocks, " of the lease's ", expected,
                                              " (layer, block) pairs"));
    }
    // What came as runs, this side counted itself; the rest the sender wrote directly.
    if (lease.num_landed + d.cma_blocks != expected) {
      return absl::DataLossError(absl::StrCat(lease.num_landed, " (layer, block) pairs landed here and the sender "
                                              "wrote ", d.cma_blocks, " directly, of the lease's ", expected));
    }
    for (uint32_t i = 0; i < d.num_checksums; ++i) {
      RunChecksum c{};
      if (!Take(in, c)) return absl::DataLossError("malformed KV completion checksums");
      KVMESH_RETURN_IF_ERROR(VerifyRun(lease, c));
    }
    // With checksum_runs this side requires them too, of every (layer, block): a sender
    // that sent none, or skipped some, is refused, not trusted.
    if (options_.checksum_runs && lease.num_verified != expected) {
      return absl::DataLossError(absl::StrCat("the KV sender's checksums cover ", lease.num_verified, " of the lease's ",
                                              expected, " (layer, block) pairs (checksum_runs on both sides)"));
    }
    return absl::OkStatus();
  }

  // Runs the on_released of fences just released (counted first: a caller that reads
  // num_fenced_leases() from its on_released sees them gone).
  void Released(std::vector<KvLeaseReleasedFn> released) {
    num_fenced_.store(fences_.size());
    for (KvLeaseReleasedFn& fn : released) {
      if (fn) fn();
    }
  }

  void EndLease(uint64_t token, const absl::Status& status, const KvTransferStats& stats) {
    auto it = leases_.find(token);
    if (it == leases_.end()) return;
    if (it->second.runs_in_flight > 0) {
      // UCX is still writing runs into the lease's blocks: its end (and the caller's
      // freeing of them) waits for them (Landed).
      if (!it->second.ending.has_value()) it->second.ending.emplace(status, stats);
      return;
    }
    Lease lease = std::move(it->second);
    leases_.erase(it);
    num_leases_.store(static_cast<int64_t>(leases_.size()));
    if (lease.on_done) lease.on_done(status, stats);
    // Its blocks are free once nothing can write into them: now, or when its direct
    // writer is known to write no more.
    if (lease.direct_writer.has_value() && !lease.writer_stopped && !lease.direct_writer->Gone()) {
      fences_.Add(token, lease.sender_push_id, *std::move(lease.direct_writer), std::move(lease.on_released));
      num_fenced_.store(fences_.size());
      return;
    }
    if (lease.on_released) lease.on_released();
  }

  // Worker thread, at destruction: every lease and push ends, every endpoint closes.
  void Shutdown() {
    std::vector<uint64_t> tokens;
    for (const auto& [token, lease] : leases_) tokens.push_back(token);
    for (const uint64_t t : tokens) EndLease(t, absl::CancelledError("the KV transport is shutting down"), {});
    // NOTE: fenced leases are not released: a writer may still write into their blocks.
    fences_.Clear();
    num_fenced_.store(0);
    std::vector<std::shared_ptr<PushState>> pushes;
    for (const auto& [id, st] : pushes_) pushes.push_back(st);
    for (const auto& st : pushes) {
      st->cancelled = true;
      Fail(st, absl::CancelledError("the KV transport is shutting down"));
    }
    for (auto& [key, peer] : peers_) {
      if (peer.ep == nullptr) continue;
      CloseEndpoint(peer.ep, peer.peer_failure_handling);
      peer.ep = nullptr;
    }
    // A flushing close waits for its receiver: for a second, then the worker goes anyway.
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    while (!closing_.empty() && Clock::now() < deadline) {
      ucp_worker_progress(worker_);
      ReapClosed();
    }
    for (void* r : closing_) Free(r);
    closing_.clear();
    for (const auto& st : pushes) {
      std::lock_guard<std::mutex> lock(st->mu);
      st->inflight = 0;
    }
    inflight_ = 0;
    pushes_.clear();
    peers_.clear();
  }

  const UcxKvTransportOptions options_;
  const bool cma_allowed_;           // same-host puts by cross-memory attach (ucx/cma_put.h)
  std::atomic<bool> cma_refused_{false};  // ... which the kernel refused: not tried again
  const bool shm_allowed_;           // UCX_TLS lets active messages go over shared memory
  const std::string host_identity_;  // LocalHostIdentity()
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string worker_address_;
  uint64_t token_salt_ = 0;
  std::atomic<uint64_t> next_token_{1};
  std::atomic<uint64_t> next_push_id_{0};
  std::atomic<int64_t> num_leases_{0};
  std::atomic<int64_t> num_pushes_{0};
  std::atomic<int64_t> num_fenced_{0};
  std::atomic<int64_t> num_requests_{0};

  mutable std::mutex pools_mu_;
  std::deque<Pool> pools_;  // guarded by pools_mu_; a deque: entries never move

  std::mutex mu_;
  int task_efd_ = -1;    // Post() wakes the loop through it
  int worker_efd_ = -1;  // UCX's wakeup fd (-1: poll ticks only)
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;

  // Worker thread only.
  absl::flat_hash_map<uint64_t, Lease> leases_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PushState>> pushes_;
  absl::flat_hash_map<std::string, Peer> peers_;
  int64_t inflight_ = 0;
  bool peer_mode_usable_ = true;  // false once UCX refused UCP_ERR_HANDLING_MODE_PEER
  WriterFences fences_;
  int64_t requests_ = 0;  // UCX requests in progress (Posted, not yet Free)
  std::vector<void*> closing_;  // flushing endpoint closes in progress (CloseEndpoint)
  Clock::time_point last_fence_check_;
  AmArg am_args_[kLastAmId + 1];
};

namespace {

class UcxPush : public KvPush {
 public:
  UcxPush(UcxKvTransport::Impl& impl, std::shared_ptr<PushState> st) : impl_(impl), st_(std::move(st)) {}
  // Dropped without Finish: the transfer is abandoned.
  ~UcxPush() override {
    bool finishing;
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      finishing = st_->finishing;
    }
    if (!finishing) impl_.Cancel(st_);
  }
  absl::Status PutLayer(int32_t layer, int32_t first_index, std::span<const BlockId> src_blocks) override {
    return impl_.PutLayer(st_, layer, first_index, src_blocks);
  }
  void Finish(KvPushDoneFn on_done) override { impl_.Finish(st_, std::move(on_done)); }
  void Cancel() override { impl_.Cancel(st_); }

 private:
  UcxKvTransport::Impl& impl_;
  const std::shared_ptr<PushState> st_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxKvTransport>> UcxKvTransport::Create(const UcxKvTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  KVMESH_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<UcxKvTransport>(new UcxKvTransport(std::move(impl)));
}

UcxKvTransport::UcxKvTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxKvTransport::~UcxKvTransport() = default;

absl::StatusOr<KvPoolHandle> UcxKvTransport::RegisterPool(std::byte* base, const KvLayout& layout) {
  return impl_->RegisterPool(base, layout);
}
absl::StatusOr<KvLeaseGrant> UcxKvTransport::OpenLease(KvPoolHandle pool, KvLeaseOptions options,
                                                       KvLeaseDoneFn on_done) {
  return impl_->OpenLease(pool, std::move(options), std::move(on_done));
}
void UcxKvTransport::CloseLease(uint64_t lease_token, absl::Status status) {
  impl_->CloseLease(lease_token, std::move(status));
}
absl::StatusOr<std::unique_ptr<KvPush>> UcxKvTransport::OpenPush(KvPoolHandle pool, std::string_view descriptor) {
  KVMESH_ASSIGN_OR_RETURN(std::shared_ptr<PushState> st, impl_->OpenPush(pool, descriptor));
  return std::unique_ptr<KvPush>(new UcxPush(*impl_, std::move(st)));
}
int64_t UcxKvTransport::num_open_leases() const { return impl_->num_open_leases(); }
int64_t UcxKvTransport::num_open_pushes() const { return impl_->num_open_pushes(); }
int64_t UcxKvTransport::num_fenced_leases() const { return impl_->num_fenced_leases(); }
int64_t UcxKvTransport::num_outstanding_requests() const { return impl_->num_outstanding_requests(); }
std::vector<std::string> UcxKvTransport::peer_transports() const { return impl_->peer_transports(); }

}  // namespace kvmesh::kv
