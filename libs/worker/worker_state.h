// WorkerState: what the reactors of one worker's kvmesh.v1.Worker service share — the
// engine, the worker's identity and KV layout, channels to peers, the decode side's open
// leases by wire transfer id, the live requests, and the metrics.
//
// Thread-safety: thread-safe. SetIdentity and SetMetrics happen once, before serving.
// Destruction: after the server (no call running), with the engine drained and alive;
// first cancels and waits for the worker's calls to its peers (OutgoingCalls).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/async_engine.h"
#include "kv/kv_block_spec.h"
#include "kv/kv_layout.h"
#include "kv/transport/kv_rank_group.h"
#include "kv/transport/kv_transport.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/sampling_conversions.h"
#include "serving/serving_metrics.h"
#include "worker/kv_transfer_metrics.h"
#include "worker/outgoing_calls.h"

namespace kvmesh::worker {

class WorkerState {
 public:
  // `engine` must outlive this.
  WorkerState(engine::AsyncEngine& engine, std::string worker_id, v1::KvCacheSpec spec, kv::KvBlockSpec block_spec,
              std::vector<int32_t> eos_token_ids, int64_t lease_timeout_ms)
      : engine_(engine),
        worker_id_(std::move(worker_id)),
        spec_(std::move(spec)),
        block_spec_(block_spec),
        eos_token_ids_(std::move(eos_token_ids)),
        lease_timeout_ms_(lease_timeout_ms) {}

  engine::AsyncEngine& engine() { return engine_; }
  const v1::KvCacheSpec& spec() const { return spec_; }
  const kv::KvBlockSpec& block_spec() const { return block_spec_; }
  int64_t lease_timeout_ms() const { return lease_timeout_ms_; }
  // Set once, before the worker is registered (nobody calls it before then).
  void SetIdentity(std::string worker_id, std::string address) {
    worker_id_ = std::move(worker_id);
    address_ = std::move(address);
  }
  const std::string& address() const { return address_; }
  const std::string& worker_id() const { return worker_id_; }

  // Optional; both must outlive this. Set once, before serving.
  void SetMetrics(serving::ServingMetrics* serving, KvTransferMetrics* transfer) {
    serving_metrics_ = serving;
    transfer_metrics_ = transfer;
  }
  serving::ServingMetrics* serving_metrics() const { return serving_metrics_; }

  // Prefill side: push each layer's KV as soon as it is computed (the default), or all
  // of it after the prefill (for comparison). Set once, before serving.
  void SetStreamKvLayers(bool stream) { stream_kv_layers_ = stream; }
  bool stream_kv_layers() const { return stream_kv_layers_; }
  KvTransferMetrics* transfer_metrics() const { return transfer_metrics_; }

  // The one-sided KV transport (UCX): each tensor-parallel rank's transport and
  // registered pool, rank order (kv/transport/kv_rank_group.h); none: the gRPC stream
  // only. Transports and pools must outlive this. Set once, before serving.
  struct KvRankTransport {
    kv::KvRankPool pool;
    const std::byte* base = nullptr;  // the rank's pool memory
    kv::KvLayout layout;
  };
  void SetKvTransports(std::vector<KvRankTransport> ranks) {
    kv_ranks_ = std::move(ranks);
    kv_rank_pools_.clear();
    for (const KvRankTransport& r : kv_ranks_) kv_rank_pools_.push_back(r.pool);
  }
  bool has_kv_transport() const { return !kv_rank_pools_.empty(); }
  std::span<const kv::KvRankPool> kv_rank_pools() const { return kv_rank_pools_; }
  // Ranks of this worker's tensor-parallel group (1 without TP).
  int32_t tp_size() const { return std::max(spec_.tp_size(), 1); }
  // The pool block id of `block`, one layer-`layer` block of rank `rank`'s pool (the
  // spans a KvLayerSink gets); InvalidArgument when it is not one.
  absl::StatusOr<kv::BlockId> PoolBlockOf(int32_t rank, int32_t layer, std::span<const std::byte> block) const {
    if (rank < 0 || rank >= static_cast<int32_t>(kv_ranks_.size())) {
      return absl::FailedPreconditionError(absl::StrCat("no registered KV pool for rank ", rank));
    }
    const KvRankTransport& r = kv_ranks_[static_cast<size_t>(rank)];
    const kv::KvLayout& l = r.layout;
    const int64_t offset = block.data() - r.base - l.BlockOffset(layer, kv::BlockId{0});
    if (offset < 0 || offset % l.BlockBytes() != 0 || offset / l.BlockBytes() >= l.num_blocks() ||
        static_cast<int64_t>(block.size()) != l.BlockBytes()) {
      return absl::InvalidArgumentError("a KV block outside the registered pool");
    }
    return kv::BlockId{static_cast<int32_t>(offset / l.BlockBytes())};
  }

  // A channel per peer address, reused. Peers ping every 500 ms and give up on a
  // connection after 1 s without an answer: a peer that died or hangs (SIGSTOP) fails
  // the calls in flight to it within about 1.5 s, not at their deadline.
  std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& channel = channels_[address];
    if (!channel) channel = rpc::CreateChannel(address, PeerChannelOptions());
    return channel;
  }
  static rpc::ChannelOptions PeerChannelOptions() {
    rpc::ChannelOptions options;
    options.keepalive_time_ms = 500;  // the worker's server accepts pings this often
    options.keepalive_timeout_ms = 1000;
    return options;
  }

  // Decode side: what happens when a remote prefill fails before its KV landed. Set
  // once, before serving.
  struct RemotePrefillPolicy {
    bool fallback_to_local = true;  // prefill here instead of failing the request
    // The Prefill call's deadline: base + per token of the prompt (capped by the lease
    // timeout), so a prefill worker that accepted the call and then stalls is given up
    // on in proportion to the work asked of it.
    int64_t timeout_base_ms = 5000;
    int64_t timeout_us_per_token = 5000;
  };
  void SetRemotePrefillPolicy(RemotePrefillPolicy policy) { remote_prefill_policy_ = policy; }
  const RemotePrefillPolicy& remote_prefill_policy() const { return remote_prefill_policy_; }
  int64_t RemotePrefillTimeoutMs(int64_t num_prompt_tokens) const {
    const int64_t ms = remote_prefill_policy_.timeout_base_ms +
                       num_prompt_tokens * remote_prefill_policy_.timeout_us_per_token / 1000;
    return std::min(ms, lease_timeout_ms_);
  }

  // Tells the scheduler that a peer (by address) could not be reached, so it stops
  // placing on it before its heartbeats expire. Optional (no scheduler: none). Set
  // once, before serving; called from any thread, must not block.
  using UnreachableReporter = std::function<void(const std::string& address, const std::string& reason)>;
  void SetUnreachableReporter(UnreachableReporter reporter) { report_unreachable_ = std::move(reporter); }
  void ReportUnreachable(const std::string& address, const std::string& reason) const {
    if (report_unreachable_) report_unreachable_(address, reason);
  }

  // The engine request of a Generate / Prefill call (validated by the engine).
  absl::StatusOr<engine::EngineRequest> ToEngineRequest(const std::string& request_id,
                                                       const google::protobuf::RepeatedField<int32_t>& prompt,
                                                       const v1::SamplingParams& sampling,
                                                       const google::protobuf::RepeatedField<int32_t>& eos) const {
    if (request_id.empty()) return absl::InvalidArgumentError("request_id: empty");
    engine::EngineRequest r;
    r.request_id = request_id;
    r.prompt_token_ids.assign(prompt.begin(), prompt.end());
    auto params = rpc::SamplingParamsFromProto(sampling);
    if (!params.ok()) return params.status();
    r.sampling_params = *params;
    auto n = rpc::NumSamplesFromProto(sampling);
    if (!n.ok()) return n.status();
    r.n = *n;
    if (eos.empty()) {
      r.eos_token_ids = eos_token_ids_;
    } else {
      r.eos_token_ids.assign(eos.begin(), eos.end());
    }
    return r;
  }

  // Decode side: the open leases a PushKvBlocks may write, by wire transfer id.
  struct Lease {
    engine::KvTransferId id;
    absl::flat_hash_map<int32_t, int32_t> index_of_block;  // destination block id -> lease index
  };
  void AddLease(const std::string& transfer_id, Lease lease) {
    std::lock_guard<std::mutex> lock(mu_);
    leases_[transfer_id] = std::move(lease);
  }
  void RemoveLease(const std::string& transfer_id) {
    std::lock_guard<std::mutex> lock(mu_);
    leases_.erase(transfer_id);
  }
  std::optional<Lease> FindLease(const std::string& transfer_id) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = leases_.find(transfer_id);
    if (it == leases_.end()) return std::nullopt;
    return it->second;
  }

  // The calls this worker has open to its peers; shutdown cancels and waits for them
  // (before the KV transport goes) while the engine they post to is alive.
  OutgoingCalls& outgoing_calls() { return outgoing_calls_; }

  // Requests in flight here (for Abort's `found`).
  void AddLive(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(id);
  }
  void RemoveLive(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(id);
  }
  bool IsLive(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.contains(id);
  }

 private:
  engine::AsyncEngine& engine_;
  std::string worker_id_;  // set once before serving
  const v1::KvCacheSpec spec_;
  const kv::KvBlockSpec block_spec_;
  const std::vector<int32_t> eos_token_ids_;
  const int64_t lease_timeout_ms_;
  std::string address_;  // set once before serving
  serving::ServingMetrics* serving_metrics_ = nullptr;  // set once before serving
  KvTransferMetrics* transfer_metrics_ = nullptr;       // set once before serving
  bool stream_kv_layers_ = true;                        // set once before serving
  std::vector<KvRankTransport> kv_ranks_;              // set once before serving
  std::vector<kv::KvRankPool> kv_rank_pools_;           // set once before serving: kv_ranks_' pools
  RemotePrefillPolicy remote_prefill_policy_;           // set once before serving
  UnreachableReporter report_unreachable_;              // set once before serving

  std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  absl::flat_hash_map<std::string, Lease> leases_;
  absl::flat_hash_set<std::string> live_;
  // Last: destroyed first, waiting for the calls that use the members above.
  OutgoingCalls outgoing_calls_;
};

}  // namespace kvmesh::worker
