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
#include "kv/transport/kv_runs.h"

namespace kvmesh::kv {
namespace {

using Clock = std::chrono::steady_clock;

// Active-message ids. To the receiver: Hello, Progress, Done, Abort. Back to the
// sender: HelloAck, DoneAck, Refused, ProgressAck (the receiver's keepalive).
enum AmId : unsigned { kHello = 1, kProgress, kDone, kAbort, kHelloAck, kDoneAck, kRefused, kProgressAck, kRun };
constexpr unsigned kLastAmId = kProgressAck;  // the control messages; kRun has its own handler

// Every message starts with the lease token and the sender's push id.
struct MsgHead {
  uint64_t lease_token;
  uint64_t push_id;
};
// Done: then the counts, then num_checksums RunChecksum records.
struct DoneBody {
  int64_t blocks;
  int64_t bytes;
  int64_t cma_blocks;  // of `blocks`, written by cross-memory attach (the receiver saw none of them)
  uint32_t num_checksums;
};
// A run's data message (kRun, the data its payload): which (layer, lease indices) it fills.
struct RunHead {
  uint64_t lease_token;
  uint64_t push_id;
  int32_t layer;
  int32_t first_index;  // into the lease's block ids
  int32_t num_blocks;
};
struct RunChecksum {
  int32_t layer;
  int32_t first_index;
  int32_t num_blocks;
  uint64_t checksum;  // kv::Checksum of the run's bytes in that layer
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
  // The lease ended while runs were still landing: it ends with this once they have
  // (its blocks must not be handed back while UCX writes into them).
  std::optional<std::pair<absl::Status, KvTransferStats>> ending;
  // A Done that arrived before every run had landed (its body), answered once they have.
  std::optional<std::string> pending_done;
};

// A connection to one remote worker, shared by the pushes to it (worker thread only).
struct Peer {
  ucp_ep_h ep = nullptr;
  bool failed = false;
  absl::Status error;
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
  // PutLayer's thread; 0 once the kernel refused it (rendezvous runs from then on).
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
  std::vector<RunChecksum> checksums;
  int64_t cma_blocks = 0;  // (layer, block) pairs written by cross-memory attach
  KvPushDoneFn on_done;
  std::optional<absl::Status> done_answer;  // the DoneAck's answer
  bool done = false;

  // Worker thread only.
  std::string peer_key;     // the receiver's worker address
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  int64_t inflight = 0;     // runs and flushes not yet completed
  bool flush_posted = false;
  bool done_sent = false;
  bool cancelled_on_worker = false;
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
          num_layers = d.spec.num_layers]() mutable {
      const size_t pairs = static_cast<size_t>(num_layers) * ids.size();
      leases_[token] = Lease{.pool = pool, .block_ids = std::move(ids), .on_done = std::move(on_done),
                             .last_heard = Clock::now(), .taken = std::vector<bool>(pairs, false)};
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
    if (cma_allowed_ && st->dest.receiver_pid > 0 && SameHost(st->dest)) {
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
    std::vector<RunChecksum> sums;
    if (options_.checksum_runs) {
      for (const KvRun& r : runs) {
        sums.push_back(RunChecksum{.layer = layer, .first_index = first_index + r.first_index, .num_blocks = r.num_blocks,
                                   .checksum = Checksum({st->local_base + local.BlockOffset(layer, r.src_first),
                                                         static_cast<size_t>(r.num_blocks * block_bytes)})});
      }
    }
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
      st->checksums.insert(st->checksums.end(), sums.begin(), sums.end());
    }
    if (st->cma_pid.load() > 0) {
      const uint64_t remote_layer_bytes = static_cast<uint64_t>(st->dest.pool_num_blocks) * block_bytes;
      // On the caller's thread, as the gRPC stream copies its chunks: a copy the
      // transport thread made would wait for a core while the model computes the next
      // layer (on a CPU worker every core is), and the last layers' backlog would land
      // after the prefill, as transfer tail.
      size_t i = 0;
      int64_t written_blocks = 0;
      for (; i < runs.size(); ++i) {
        const KvRun& r = runs[i];
        const absl::Status written =
            CmaWrite(st->cma_pid.load(), st->local_base + local.BlockOffset(layer, r.src_first),
                     static_cast<size_t>(r.num_blocks * block_bytes),
                     st->dest.remote_base + static_cast<uint64_t>(layer) * remote_layer_bytes +
                         static_cast<uint64_t>(r.dst_first.value) * block_bytes);
        if (written.ok()) {
          written_blocks += r.num_blocks;
          continue;
        }
        if (!absl::IsPermissionDenied(written)) {
          Post([this, st, written] { Fail(st, written); });
          return written;
        }
        KVMESH_LOG(kWarning) << "cross-memory attach refused; KV runs go through UCX"
                             << LogKv("status", written.ToString());
        st->cma_pid.store(0);
        break;
      }
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->cma_blocks += written_blocks;
      }
      if (i == runs.size()) return absl::OkStatus();
      runs.erase(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    Post([this, st, layer, first_index, runs = std::move(runs), block_bytes] {
      const KvLayout& local = *st->local_layout;
      for (const KvRun& r : runs) {
        if (st->ep == nullptr || st->cancelled_on_worker) return;
        PostRun(st, RunHead{.lease_token = st->dest.lease_token, .push_id = st->id, .layer = layer,
                            .first_index = first_index + r.first_index, .num_blocks = r.num_blocks},
                st->local_base + local.BlockOffset(layer, r.src_first), static_cast<size_t>(r.num_blocks * block_bytes));
      }
    });
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

  absl::Status Connect(const std::shared_ptr<PushState>& st) {
    st->peer_key = st->dest.worker_address;
    Peer& peer = peers_[st->peer_key];
    if (peer.failed) {
      // A peer that failed once is reconnected (the receiver may have restarted).
      peers_.erase(st->peer_key);
      return Connect(st);
    }
    if (peer.ep == nullptr) {
      ucp_ep_params_t ep_params{};
      ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep_params.address = reinterpret_cast<const ucp_address_t*>(st->dest.worker_address.data());
      ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep_params.err_handler.cb = &Impl::OnEpError;
      ep_params.err_handler.arg = this;
      // NOTE: UCX 1.13's shared-memory active-message transports (posix, sysv) have no
      // peer failure handling: an endpoint that asks for it gets tcp, over any device
      // with an address (same_host.h). So a receiver on this host is reached without
      // it, over shared memory, as is any receiver when UCX refuses it (UCX_TLS=sm;
      // tried once: UCX logs the refusal). A dead or stopped receiver then shows as its
      // missing ProgressAcks (receiver_timeout_ms) or DoneAck (ack_timeout_ms), and
      // LosePeer force-closes the endpoint.
      const bool over_shm = shm_allowed_ && SameHost(st->dest);
      ucs_status_t s = UCS_ERR_UNREACHABLE;
      if (peer_mode_usable_ && !over_shm) {
        s = ucp_ep_create(worker_, &ep_params, &peer.ep);
        if (s == UCS_ERR_UNREACHABLE) peer_mode_usable_ = false;
      }
      if (s == UCS_ERR_UNREACHABLE) {
        ep_params.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
        s = ucp_ep_create(worker_, &ep_params, &peer.ep);
      }
      if (s != UCS_OK) {
        peers_.erase(st->peer_key);
        return absl::InvalidArgumentError(absl::StrCat("lease descriptor: worker address refused by UCX: ",
                                                       ucs_status_string(s)));
      }
      KVMESH_LOG(kInfo) << "connected to a KV receiver"
                        << LogKv("transports", absl::StrJoin(EndpointTransports(peer.ep), ","))
                        << LogKv("same_host", SameHost(st->dest));
    }
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
    const ucs_status_t s = ucp_ep_rkey_unpack(peer.ep, key.data(), &st->rkey);
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(absl::StrCat("lease descriptor: remote key refused by UCX: ", ucs_status_string(s)));
    }
    st->ep = peer.ep;
    st->last_keepalive = Clock::now();
    st->last_heard_receiver = st->last_keepalive;
    pushes_[st->id] = st;
    num_pushes_.store(static_cast<int64_t>(pushes_.size()));
    SendMsg(st->ep, kHello, MsgHead{st->dest.lease_token, st->id}, {});
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
    ucp_request_free(request);
    self->MaybeFlush(st);
  }

  // Once Finish was called and every run completed: flush the endpoint, then (in the
  // flush's callback) send Done.
  void MaybeFlush(const std::shared_ptr<PushState>& st) {
    bool finishing;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      finishing = st->finishing && !st->done;
      failed = !st->error.ok();
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
    if (st->inflight > 0 || st->done_sent || st->ep == nullptr) return;
    // Every put is remotely complete: the completion may go.
    std::string body;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->done) return;
      Append(body, DoneBody{.blocks = st->stats.blocks,
                            .bytes = st->stats.bytes,
                            .cma_blocks = st->cma_blocks,
                            .num_checksums = static_cast<uint32_t>(st->checksums.size())});
      for (const RunChecksum& c : st->checksums) Append(body, c);
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
    if (done) done(status, stats);
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
    std::vector<std::shared_ptr<PushState>> hit;
    for (const auto& [id, st] : pushes_) {
      if (st->ep == ep) hit.push_back(st);
    }
    for (const auto& st : hit) {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->error.ok()) st->error = error;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(100);
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
      ucp_request_free(r);
    }
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

  // ---- Messages ----

  struct SendContext {
    std::string bytes;
  };

  void SendMsg(ucp_ep_h ep, unsigned id, const MsgHead& head, std::string_view body) {
    auto* ctx = new SendContext;
    Append(ctx->bytes, head);
    ctx->bytes.append(body);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<SendContext*>(user_data);
      ucp_request_free(request);
    };
    p.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, ctx->bytes.data(), ctx->bytes.size(), &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) delete ctx;  // sent, or failed: the endpoint's error handler reports it
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
    int32_t num_blocks;
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
      dst = pool.base + pool.layout.BlockOffset(h.layer, lease.block_ids[h.first_index]);
    }
    const size_t n = static_cast<size_t>(lease.block_ids.size());
    for (int32_t k = 0; k < h.num_blocks; ++k) lease.taken[static_cast<size_t>(h.layer) * n + h.first_index + k] = true;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      std::memcpy(dst, data, length);  // small enough to come eagerly
      lease.num_landed += h.num_blocks;
      // NOTE: from the loop: a Done it completes is answered outside UCX's callback.
      Post([this, token = h.lease_token] { AfterLastRun(token); });
      return UCS_OK;
    }
    ucp_request_param_t p{};
    auto* ctx = new RunRecv{this, h.lease_token, h.num_blocks};
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
    if (h.layer < 0 || h.layer >= layout.num_layers() || h.first_index < 0 || h.num_blocks <= 0 ||
        static_cast<int64_t>(h.first_index) + h.num_blocks > n) {
      return absl::InvalidArgumentError(absl::StrCat("KV run layer ", h.layer, " blocks [", h.first_index, ", +",
                                                     h.num_blocks, ") is outside the lease"));
    }
    if (static_cast<int64_t>(length) != h.num_blocks * layout.BlockBytes()) {
      return absl::InvalidArgumentError(absl::StrCat("KV run of ", length, " bytes for ", h.num_blocks, " blocks"));
    }
    for (int32_t k = 0; k < h.num_blocks; ++k) {
      if (k > 0 && lease.block_ids[h.first_index + k].value != lease.block_ids[h.first_index].value + k) {
        return absl::InvalidArgumentError("KV run is not contiguous in the receiver's pool");
      }
      if (lease.taken[static_cast<size_t>(h.layer) * static_cast<size_t>(n) + h.first_index + k]) {
        return absl::InvalidArgumentError(absl::StrCat("KV run repeats layer ", h.layer, " block ", h.first_index + k));
      }
    }
    return absl::OkStatus();
  }

  static void OnRunLanded(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* ctx = static_cast<RunRecv*>(user_data);
    Impl* self = ctx->impl;
    ucp_request_free(request);
    self->Landed(ctx, status);
  }

  // A run's bytes are in the pool (or failed to come): count them, then finish what
  // waited for them (a Done, or the lease's end).
  void Landed(RunRecv* ctx, ucs_status_t status) {
    const uint64_t token = ctx->lease_token;
    const int32_t blocks = ctx->num_blocks;
    delete ctx;
    --inflight_;
    auto it = leases_.find(token);
    if (it == leases_.end()) return;
    Lease& lease = it->second;
    --lease.runs_in_flight;
    if (status == UCS_OK) {
      lease.num_landed += blocks;
    } else if (!lease.ending.has_value()) {
      lease.ending.emplace(absl::UnavailableError(absl::StrCat("receiving a KV run failed: ", ucs_status_string(status))),
                           KvTransferStats{});
    }
    // NOTE: from the loop: what it ends or answers runs outside UCX's callback.
    if (lease.runs_in_flight == 0) Post([this, token] { AfterLastRun(token); });
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
  absl::Status CheckDone(const Lease& lease, std::string_view in, KvTransferStats& stats) {
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
      const int64_t n_lease = static_cast<int64_t>(lease.block_ids.size());
      if (c.layer < 0 || c.layer >= layout.num_layers() || c.first_index < 0 || c.num_blocks <= 0 ||
          static_cast<int64_t>(c.first_index) + c.num_blocks > n_lease) {
        return absl::DataLossError("KV completion names a run outside the lease");
      }
      for (int32_t k = 1; k < c.num_blocks; ++k) {
        if (lease.block_ids[c.first_index + k].value != lease.block_ids[c.first_index].value + k) {
          return absl::DataLossError("KV completion names a run that is not contiguous here");
        }
      }
      const std::byte* at = pool->base + layout.BlockOffset(c.layer, lease.block_ids[c.first_index]);
      if (Checksum({at, static_cast<size_t>(c.num_blocks * layout.BlockBytes())}) != c.checksum) {
        return absl::DataLossError(absl::StrCat("KV run layer ", c.layer, " blocks [", c.first_index, ", ",
                                                c.first_index + c.num_blocks, ") landed with a different checksum"));
      }
    }
    return absl::OkStatus();
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
  }

  // Worker thread, at destruction: every lease and push ends, every endpoint closes.
  void Shutdown() {
    std::vector<uint64_t> tokens;
    for (const auto& [token, lease] : leases_) tokens.push_back(token);
    for (const uint64_t t : tokens) EndLease(t, absl::CancelledError("the KV transport is shutting down"), {});
    std::vector<std::shared_ptr<PushState>> pushes;
    for (const auto& [id, st] : pushes_) pushes.push_back(st);
    for (const auto& st : pushes) {
      st->cancelled = true;
      Fail(st, absl::CancelledError("the KV transport is shutting down"));
    }
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    for (auto& [key, peer] : peers_) {
      if (peer.ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(peer.ep, &p);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
      peer.ep = nullptr;
    }
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
std::vector<std::string> UcxKvTransport::peer_transports() const { return impl_->peer_transports(); }

}  // namespace kvmesh::kv
