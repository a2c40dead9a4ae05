#include "worker/generate_call.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "rpc/cancel_before_done.h"
#include "rpc/status_conversion.h"

namespace kvmesh::worker {
namespace {

// One outgoing Prefill call. Shared by its completion callback, the UCX lease's
// callback and the reactor (which cancels it when the request ends first).
//
// With UCX the lease ends after two events, in either order: the Prefill reply (the
// first token, and which transport the prefill worker used) and the transport's verdict
// on the lease (every (layer, block) landed, or the sender died / went quiet). The lease
// is committed only when both say OK; the first failure fails it at once (the Prefill
// call is then cancelled).
struct PrefillClientCall {
  grpc::ClientContext context;
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  std::unique_ptr<v1::Worker::Stub> stub;
  std::string prefill_address;

  std::mutex mu;
  bool ucx_offered = false;  // set before the call starts
  std::vector<uint64_t> ucx_tokens;  // set before the call starts: one lease per TP rank
  std::optional<absl::Status> ucx_verdict;  // guarded by mu
  kv::KvTransferStats ucx_stats;            // guarded by mu
  std::optional<absl::Status> reply;        // guarded by mu: the Prefill call's status
  bool resolved = false;                    // guarded by mu: commit or failure posted
  // Guarded by mu: the request ended first, so the call's cancel and the lease's closing
  // that follow are this worker's doing, not the prefill worker's: nothing to commit or
  // fall back to, and no peer to report unreachable.
  bool request_ended = false;
};

class GenerateReactor : public grpc::ServerWriteReactor<v1::WorkerGenerateResponse> {
 public:
  GenerateReactor(WorkerState& state, const v1::WorkerGenerateRequest* request)
      : state_(state), request_id_(request->request_id()) {
    Start(*request);
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) queue_.clear();  // the stream is broken; OnCancel aborts the request
    }
    Pump();
  }
  void OnCancel() override {
    state_.engine().Abort(request_id_);
    cancel_order_.CancelReturned();
  }
  void OnDone() override {
    cancel_order_.DoneStarts();
    Unref();
  }

 private:
  rpc::CancelBeforeDone cancel_order_;
  bool offer_ucx_ = true;  // set in Start, before the engine thread reads it

  void Start(const v1::WorkerGenerateRequest& request) {
    auto engine_request = state_.ToEngineRequest(request.request_id(), request.prompt_token_ids(),
                                                 request.sampling(), request.eos_token_ids());
    if (!engine_request.ok()) return FailSubmit(engine_request.status());
    engine_request->priority = request.priority();
    engine_request->arrival_order = request.arrival_order() > 0 ? request.arrival_order() : -1;
    engine_request->on_output = [this](const engine::RequestOutput& out) { OnOutput(out); };
    engine_request->resume_output_token_ids.assign(request.resume_output_token_ids().begin(),
                                                   request.resume_output_token_ids().end());
    engine_request->cache_salt = request.cache_salt();
    const std::string& prefill = request.prefill_worker_address();
    // The scheduler picked the gRPC stream for this pair (the prefill worker has no UCX).
    offer_ucx_ = request.kv_transport() != v1::KV_TRANSPORT_GRPC_STREAM;
    absl::Status s;
    // A migrated request (resume_output_token_ids) is prefilled here: the prefill
    // worker's path knows the prompt only.
    if (prefill.empty() || request.prefill_locally() || prefill == state_.address() ||
        request.resume_output_token_ids_size() > 0) {
      s = state_.engine().Submit(*std::move(engine_request));
    } else {
      auto sampling = std::make_shared<v1::SamplingParams>(request.sampling());
      auto prompt = std::make_shared<std::vector<int32_t>>(request.prompt_token_ids().begin(),
                                                           request.prompt_token_ids().end());
      s = state_.engine().SubmitWith(
          *std::move(engine_request),
          [this, prefill, sampling, prompt](engine::Engine& e, engine::EngineRequest r) -> absl::Status {
            const std::string cache_salt = r.cache_salt;  // the prefill side must hash as this lease did
            auto lease = e.ReserveForRemotePrefill(std::move(r));
            if (!lease.ok()) return lease.status();
            StartRemotePrefill(e, *lease, prefill, *sampling, *prompt, cache_salt);
            return absl::OkStatus();
          });
    }
    // A draining engine refuses new requests (FailedPrecondition; bad input is
    // InvalidArgument): hand it back (ABORTED), the router places it elsewhere.
    if (absl::IsFailedPrecondition(s)) {
      return FailSubmit(absl::AbortedError(absl::StrCat("the worker is draining: ", s.message())));
    }
    if (!s.ok()) return FailSubmit(s);
    state_.AddLive(request_id_);
  }

  void FailSubmit(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finish_status_ = status;
    }
    Pump();
    Unref();  // the engine never saw the request
  }

  // On the engine thread, right after the lease is granted: asks the prefill worker to
  // fill it. The reply (gRPC thread) posts the commit or the failure.
  void StartRemotePrefill(engine::Engine& engine, const engine::RemotePrefillLease& lease,
                          const std::string& prefill_address, const v1::SamplingParams& sampling,
                          const std::vector<int32_t>& prompt, const std::string& cache_salt) {
    const std::string transfer_id = absl::StrCat(state_.worker_id(), "/", lease.transfer_id.value);
    WorkerState::Lease entry{.id = lease.transfer_id, .index_of_block = {}};
    for (int32_t i = lease.num_cached_blocks(); i < lease.num_blocks(); ++i) {
      entry.index_of_block[lease.block_ids[i].value] = i;
    }
    state_.AddLease(transfer_id, std::move(entry));

    auto call = std::make_shared<PrefillClientCall>();
    call->request.set_request_id(request_id_);
    call->request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    *call->request.mutable_sampling() = sampling;
    call->request.set_cache_salt(cache_salt);
    v1::KvDestination* dest = call->request.mutable_destination();
    dest->set_decode_worker_address(state_.address());
    dest->set_transfer_id(transfer_id);
    // Every rank holds the block under the same id (kv_handoff.h, tensor parallelism).
    for (int32_t rank = 0; rank < lease.tp_size; ++rank) {
      v1::RankBlocks* blocks = dest->add_blocks_per_rank();
      blocks->set_rank(rank);
      for (int32_t i = lease.num_cached_blocks(); i < lease.num_blocks(); ++i) {
        blocks->add_block_ids(lease.block_ids[i].value);
      }
    }
    *dest->mutable_kv_cache_spec() = state_.spec();
    dest->set_num_skip_blocks(lease.num_cached_blocks());
    dest->set_transport(v1::KV_TRANSPORT_GRPC_STREAM);
    // A deadline in proportion to the work asked (capped by the lease timeout): a
    // prefill worker that took the call and then stalls is given up on in time for a
    // local prefill to be worth it. (A dead or stopped one is noticed sooner, by the
    // channel's keepalive or UCX's progress deadline.)
    rpc::SetTimeout(&call->context,
                    state_.RemotePrefillTimeoutMs(static_cast<int64_t>(prompt.size()) - lease.num_cached_tokens));
    call->stub = v1::Worker::NewStub(state_.Channel(prefill_address));
    call->prefill_address = prefill_address;
    const engine::KvTransferId id = lease.transfer_id;
    WorkerState* state = &state_;
    const std::optional<OutgoingCalls::CallId> outgoing =
        state_.outgoing_calls().Begin([call] { call->context.TryCancel(); });
    if (!outgoing.has_value()) {
      state_.RemoveLease(transfer_id);
      return FailOrFallBack(state_, id, absl::CancelledError("the decode worker is stopping"), prefill_address);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_call_ = call;
    }
    const bool want_logprobs = sampling.has_logprobs();
    if (offer_ucx_ && state_.has_kv_transport()) {
      // Offer UCX: the prefill worker puts straight into these blocks when it has UCX
      // too, else it pushes over the gRPC stream (the lease above serves that).
      std::vector<kv::BlockId> ids(lease.block_ids.begin() + lease.num_cached_blocks(), lease.block_ids.end());
      auto grant = kv::OpenRankGroupLease(
          state_.kv_rank_pools(), ids,
          [call, state, id, want_logprobs](const absl::Status& status, const kv::KvTransferStats& stats) {
            {
              std::lock_guard<std::mutex> lock(call->mu);
              call->ucx_verdict = status;
              call->ucx_stats = stats;
            }
            Resolve(call, *state, id, want_logprobs);
          },
          // Until then the lease's blocks stay quarantined should it end uncommitted:
          // a same-host sender may still write into them.
          [state, id] { state->engine().Post([id](engine::Engine& e) { e.KvWritersGone(id); }); });
      if (grant.ok()) {
        engine.ExpectDirectKvWrites(id);
        call->ucx_offered = true;
        call->ucx_tokens = grant->lease_tokens;
        dest->set_transport(v1::KV_TRANSPORT_UCX);
        for (std::string& d : grant->descriptors) dest->add_kv_lease_descriptors(std::move(d));
      } else {
        KVMESH_LOG(kWarning) << "no UCX lease, offering the gRPC stream" << LogKv("status", grant.status().ToString());
      }
    }
    // NOTE: the callback captures the state, not the reactor: the reactor may be gone
    // (request aborted) by the time the prefill worker answers.
    // NOTE: the call's registration ends last: shutdown waits for it before the state
    // and the KV transport go. (The UCX lease's callback is the transport's to end.)
    call->stub->async()->Prefill(&call->context, &call->request, &call->response,
                                 [call, state, id, transfer_id, prefill_address, want_logprobs,
                                  outgoing = *outgoing](grpc::Status status) {
                                   state->RemoveLease(transfer_id);
                                   absl::Status s = rpc::FromGrpcStatus(status);
                                   if (!s.ok()) {
                                     s = absl::Status(s.code(), absl::StrCat("remote prefill on ", prefill_address,
                                                                             " failed: ", s.message()));
                                     KVMESH_LOG(kWarning) << "remote prefill failed" << LogKv("transfer", transfer_id)
                                                          << LogKv("status", s.ToString());
                                   }
                                   {
                                     std::lock_guard<std::mutex> lock(call->mu);
                                     call->reply = s;
                                   }
                                   Resolve(call, *state, id, want_logprobs);
                                   state->outgoing_calls().End(outgoing);
                                 });
  }

  // Any thread, after each of the call's events: posts the commit or the failure once it
  // is decided (see PrefillClientCall).
  static void Resolve(const std::shared_ptr<PrefillClientCall>& call, WorkerState& state, engine::KvTransferId id,
                      bool want_logprobs) {
    std::optional<absl::Status> failure;
    bool commit = false;
    bool close_ucx = false;
    bool cancel_call = false;
    bool request_ended = false;
    {
      std::lock_guard<std::mutex> lock(call->mu);
      if (call->resolved) return;
      request_ended = call->request_ended;
      const bool used_ucx = call->reply.has_value() && call->reply->ok() &&
                            call->response.kv_transport_used() == v1::KV_TRANSPORT_UCX;
      if (call->reply.has_value() && !call->reply->ok()) {
        failure = *call->reply;
        close_ucx = call->ucx_offered && !call->ucx_verdict.has_value();
      } else if (call->ucx_verdict.has_value() && !call->ucx_verdict->ok() &&
                 (used_ucx || !call->reply.has_value())) {
        // The transport noticed first (the sender died or went quiet): fail now.
        // UNAVAILABLE, as a failed Prefill call: the router may retry elsewhere.
        failure = absl::UnavailableError(absl::StrCat("remote prefill on ", call->prefill_address,
                                                      " failed: KV transfer over UCX: ", call->ucx_verdict->message()));
        cancel_call = !call->reply.has_value();
      } else if (call->reply.has_value() && !used_ucx) {
        commit = true;  // pushed over the gRPC stream: the imports are done
        close_ucx = call->ucx_offered && !call->ucx_verdict.has_value();
      } else if (used_ucx && call->ucx_verdict.has_value()) {
        commit = true;  // every (layer, block) landed and the first token is here
      } else {
        return;  // one event still to come
      }
      call->resolved = true;
    }
    if (KvTransferMetrics* m = state.transfer_metrics(); m != nullptr && call->ucx_offered) {
      std::lock_guard<std::mutex> lock(call->mu);
      if (call->ucx_verdict.has_value() && !close_ucx) {
        const kv::KvTransferStats& st = call->ucx_stats;
        m->AddBytes(KvTransferMetrics::Direction::kReceived, st.bytes);
        m->EndTransfer(KvTransferMetrics::Direction::kReceived, KvTransferMetrics::Transport::kUcx, 0, 0,
                       *call->ucx_verdict);
      }
    }
    if (close_ucx) {
      // Unavailable: the prefill worker is gone or unreachable, so the transport must
      // not answer on its endpoint (UCX may have torn it down: sending there crashed).
      const bool peer_lost = failure.has_value() && failure->code() == absl::StatusCode::kUnavailable;
      kv::CloseRankGroupLease(state.kv_rank_pools(), call->ucx_tokens,
                              peer_lost ? absl::UnavailableError("the KV sender is unreachable")
                                        : absl::CancelledError("the KV went another way"));
    }
    if (cancel_call) call->context.TryCancel();
    if (request_ended) return;
    if (failure.has_value()) return FailOrFallBack(state, id, *failure, call->prefill_address);
    if (!commit) return;
    std::optional<engine::SampleResult> logprobs;
    if (want_logprobs) logprobs = rpc::SampleResultFromProto(call->response.first_logprob());
    const int32_t first = call->response.first_token_id();
    const bool fallback = state.remote_prefill_policy().fallback_to_local;
    state.engine().Post([id, first, logprobs, fallback](engine::Engine& e) {
      auto committed = e.CommitRemotePrefill(id, first, logprobs);
      if (committed.ok()) return;
      // Not all blocks arrived, or a bad first token (or the lease ended meanwhile:
      // then these fail too, harmlessly).
      const absl::Status failure =
          absl::IsFailedPrecondition(committed.status())
              ? absl::DataLossError(absl::StrCat("KV transfer incomplete: ", committed.status().message()))
              : committed.status();
      if (fallback && e.FallBackToLocalPrefill(id, failure).ok()) {
        KVMESH_LOG(kWarning) << "remote prefill unusable; prefilling locally" << LogKv("status", failure.ToString());
        return;
      }
      (void)e.FailRemotePrefill(id, failure);
    });
  }

  // Any thread: the remote prefill failed before its KV landed. The scheduler hears of
  // a prefill worker that could not be reached (so it stops placing there now), and the
  // request is prefilled here instead (RemotePrefillPolicy::fallback_to_local) or
  // fails with `failure`.
  static void FailOrFallBack(WorkerState& state, engine::KvTransferId id, const absl::Status& failure,
                             const std::string& prefill_address) {
    // Unreachable (refused, reset, no keepalive answer), not merely slow: a deadline
    // that passed may be a busy prefill worker, which stays placeable.
    if (absl::IsUnavailable(failure)) {
      state.ReportUnreachable(prefill_address, std::string(failure.message()));
    }
    const bool fallback = state.remote_prefill_policy().fallback_to_local;
    state.engine().Post([id, failure, fallback](engine::Engine& e) {
      if (fallback) {
        const absl::Status s = e.FallBackToLocalPrefill(id, failure);
        if (s.ok()) {
          KVMESH_LOG(kWarning) << "remote prefill failed; prefilling locally" << LogKv("status", failure.ToString());
          return;
        }
        // FailedPrecondition: the request ended meanwhile (aborted): nothing to do.
        if (absl::IsFailedPrecondition(s)) return;
      }
      (void)e.FailRemotePrefill(id, failure);
    });
  }

  // Engine thread.
  void OnOutput(const engine::RequestOutput& out) {
    serving::ServingMetrics* metrics = state_.serving_metrics();
    std::shared_ptr<PrefillClientCall> prefill_call;
    bool new_tokens = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const engine::CompletionOutput& c : out.outputs) {
        v1::WorkerGenerateResponse response;
        response.set_request_id(out.request_id);
        response.set_index(c.index);
        response.mutable_token_ids()->Add(c.new_token_ids.begin(), c.new_token_ids.end());
        for (const engine::SampleResult& r : c.new_logprobs) rpc::SampleResultToProto(r, response.add_logprobs());
        response.set_finish_reason(rpc::FinishReasonToProto(c.finish_reason));
        if (c.stop_token_id) response.set_stop_token_id(*c.stop_token_id);
        if (!sent_first_[c.index]) {
          sent_first_[c.index] = true;
          response.set_num_prompt_tokens(out.num_prompt_tokens);
          response.set_num_cached_tokens(out.num_cached_prompt_tokens);
          if (metrics && c.index == 0) metrics->AddPromptTokens(out.num_prompt_tokens);
        }
        if (metrics) {
          metrics->AddGenerationTokens(static_cast<int64_t>(c.new_token_ids.size()));
          num_generated_tokens_ += static_cast<int64_t>(c.new_token_ids.size());
          if (c.finished()) metrics->CountFinished(engine::CompletionFinishReasonName(c.finish_reason));
        }
        new_tokens |= !c.new_token_ids.empty();
        if (!out.status.ok() && c.finish_reason == engine::CompletionFinishReason::kError) continue;
        queue_.push_back(std::move(response));
      }
      if (out.finished) {
        finish_status_ = out.status;
        if (metrics) metrics->ObserveFinishedRequest(out.times, out.num_prompt_tokens, num_generated_tokens_);
        prefill_call = std::move(prefill_call_);
      }
    }
    if (metrics) ObserveLatency(*metrics, new_tokens, out.finished);
    // The request ended: a Prefill still running for it is cancelled (a finished call
    // ignores this), so the prefill worker frees its blocks too.
    if (prefill_call) {
      {
        std::lock_guard<std::mutex> lock(prefill_call->mu);
        prefill_call->request_ended = true;
      }
      prefill_call->context.TryCancel();
      // Its UCX lease too: the blocks are gone, the sender is refused from now on.
      if (prefill_call->ucx_offered) {
        kv::CloseRankGroupLease(state_.kv_rank_pools(), prefill_call->ucx_tokens,
                                absl::CancelledError("the request ended"));
      }
    }
    Pump();
    if (out.finished) {
      state_.RemoveLive(request_id_);
      Unref();
    }
  }

  // Engine thread. This worker's side of the request's latency: from the Generate call
  // to its first token (the remote prefill included), between outputs, and to its end.
  void ObserveLatency(serving::ServingMetrics& metrics, bool new_tokens, bool finished) {
    const auto now = std::chrono::steady_clock::now();
    if (new_tokens) {
      if (!last_token_at_) {
        metrics.ObserveTimeToFirstToken(std::chrono::duration<double>(now - start_).count());
      } else {
        metrics.ObserveInterTokenLatency(std::chrono::duration<double>(now - *last_token_at_).count());
      }
      last_token_at_ = now;
    }
    if (finished) metrics.ObserveEndToEnd(std::chrono::duration<double>(now - start_).count());
  }

  void Pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      StartWrite(&current_);
      return;
    }
    if (finish_status_.has_value()) {
      finish_called_ = true;
      const absl::Status s = *finish_status_;
      lock.unlock();
      Finish(rpc::ToGrpcStatus(s));
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  WorkerState& state_;
  const std::string request_id_;
  std::atomic<int> refs_{2};  // gRPC + the engine
  std::mutex mu_;
  std::deque<v1::WorkerGenerateResponse> queue_;
  v1::WorkerGenerateResponse current_;
  bool writing_ = false;
  bool finish_called_ = false;
  std::optional<absl::Status> finish_status_;
  absl::flat_hash_map<int32_t, bool> sent_first_;
  std::shared_ptr<PrefillClientCall> prefill_call_;  // until the request ends
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> last_token_at_;  // engine thread only
  int64_t num_generated_tokens_ = 0;                                    // engine thread only
};

}  // namespace

grpc::ServerWriteReactor<v1::WorkerGenerateResponse>* StartGenerateCall(WorkerState& state,
                                                                        const v1::WorkerGenerateRequest* request) {
  return new GenerateReactor(state, request);
}

}  // namespace kvmesh::worker
