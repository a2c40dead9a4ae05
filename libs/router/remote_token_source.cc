#include "router/remote_token_source.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "rpc/channel.h"
#include "rpc/sampling_conversions.h"
#include "rpc/status_conversion.h"

namespace kvmesh::router {

// One Worker.Generate stream (one attempt of a Call). Holds its Call until OnDone.
class RemoteTokenSource::Stream final : public grpc::ClientReadReactor<v1::WorkerGenerateResponse> {
 public:
  Stream(std::shared_ptr<Call> call, std::shared_ptr<grpc::Channel> channel, v1::WorkerGenerateRequest request,
         int64_t timeout_ms)
      : call_(std::move(call)),
        channel_(std::move(channel)),
        stub_(v1::Worker::NewStub(channel_)),
        request_(std::move(request)) {
    rpc::SetTimeout(&context_, timeout_ms);
  }

  grpc::ClientContext& context() { return context_; }

  void Start() {
    stub_->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  std::shared_ptr<Call> call_;  // until OnDone
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::ClientContext context_;
  v1::WorkerGenerateRequest request_;
  v1::WorkerGenerateResponse response_;
};

// One request: Place, then the Generate stream; again with the decode worker excluded
// when it was unreachable. Kept alive by the source's table until its final output;
// gRPC callbacks hold a reference too.
class RemoteTokenSource::Call : public std::enable_shared_from_this<Call> {
 public:
  Call(RemoteTokenSource& source, engine::EngineRequest request)
      : source_(source), request_(std::move(request)), tokens_(static_cast<size_t>(request_.n)) {}

  const std::string& request_id() const { return request_.request_id; }

  // The stage this call is in, from mu_-guarded state only (safe from any thread).
  std::string DescribeStage() {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrCat("attempts=", attempts_, " placements=", place_attempts_.size(),
                        " stream=", stream_ != nullptr ? "open or done" : "none", " aborted=", aborted_,
                        " final_delivered=", final_delivered_);
  }

  // Asks the scheduler for a placement (attempt number ++attempts_).
  void Place() {
    auto attempt = std::make_shared<PlaceAttempt>();
    attempt->request.set_request_id(request_.request_id);
    attempt->request.set_model(source_.options_.model);
    attempt->request.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                                     request_.prompt_token_ids.end());
    // The scheduler hashes the prompt as the workers will: with the salt.
    attempt->request.set_cache_salt(request_.cache_salt);
    for (const std::string& id : excluded_) attempt->request.add_exclude_worker_ids(id);
    rpc::SetTimeout(&attempt->context, source_.options_.place_timeout_ms);
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
      if (!aborted) {
        ++attempts_;
        current_context_ = &attempt->context;
        place_attempts_.push_back(attempt);  // the context must outlive a racing Abort()
      }
    }
    // NOTE: FinishAborted() takes mu_ (Deliver): calling it with mu_ held deadlocked the
    // gRPC thread and left the request in flight forever (an Abort racing a retry).
    if (aborted) return FinishAborted();
    auto self = shared_from_this();
    source_.scheduler_->async()->Place(&attempt->context, &attempt->request, &attempt->response,
                                       [self, attempt](grpc::Status status) { self->OnPlaced(status, *attempt); });
  }

  void Abort() {
    grpc::ClientContext* context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
      context = current_context_;
    }
    // NOTE: the contexts live as long as this Call; a call not started yet is
    // cancelled when it starts.
    if (context != nullptr) context->TryCancel();
  }

  void OnResponse(const v1::WorkerGenerateResponse& response) {
    streamed_ = true;
    Emit(response);
  }

  void OnStreamDone(const grpc::Status& grpc_status, grpc::Channel& channel) {
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
    }
    if (grpc_status.ok()) return FinishWith(absl::OkStatus());
    if (aborted) return FinishAborted();
    const absl::Status status = rpc::FromGrpcStatus(grpc_status);
    if (source_.metrics_) source_.metrics_->CountUpstreamError("generate", status.code());
    const std::string worker = absl::StrCat("decode worker ", decode_id_, " (", decode_address_, ")");
    // UNAVAILABLE: the worker died (refused, reset: its channel is down, and the
    // scheduler is told) or said it cannot serve now; either way another may.
    // NOTE: the channel's state can lag the reset that ended the stream, so it only
    // decides whether to report the worker, not whether to retry.
    const bool unavailable = status.code() == absl::StatusCode::kUnavailable;
    const bool unreachable = unavailable && channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    // A draining worker hands back what it had not started (ABORTED): place it again.
    // So is a call its server cancelled while stopping (CANCELLED, which this router,
    // not aborted, never asked for).
    const bool handed_back =
        status.code() == absl::StatusCode::kAborted || status.code() == absl::StatusCode::kCancelled;
    if (unreachable) source_.ReportUnreachable(decode_id_, std::string(status.message()));
    const bool unreachable_or_gone = unavailable;
    if (streamed_) {
      // Migration: the tokens streamed so far reached the client; another decode
      // worker resumes from them (MigrationRefusal says when it cannot).
      const std::string refusal = (unreachable_or_gone || handed_back) ? MigrationRefusal() : "it failed by itself";
      if (!refusal.empty()) {
        return FinishWith(absl::Status(status.code(), absl::StrCat(worker, " failed after streaming tokens, and the "
                                                                   "request was not migrated (", refusal,
                                                                   "): ", status.message())));
      }
      resume_ = tokens_[0];
    } else if (!unreachable_or_gone && !handed_back) {
      return FinishWith(status);
    }
    last_error_ = absl::UnavailableError(absl::StrCat(
        worker, handed_back ? " handed the request back: " : unreachable ? " is unreachable: " : " is unavailable: ",
        status.message()));
    if (attempts_ >= source_.options_.max_attempts) {
      return FinishWith(absl::UnavailableError(
          absl::StrCat(last_error_.message(), " (", attempts_, " placements tried, the limit)")));
    }
    KVMESH_LOG(kWarning) << (resume_.empty() ? "decode worker lost; placing the request again"
                                             : "decode worker lost mid-stream; migrating the request")
                         << LogKv("request", request_.request_id) << LogKv("worker", decode_id_)
                         << LogKv("resume_tokens", resume_.size())
                         << LogKv("address", decode_address_) << LogKv("attempt", attempts_)
                         << LogKv("error", status.message());
    if (source_.metrics_) source_.metrics_->CountRetry();
    excluded_.push_back(decode_id_);
    Place();
  }

 private:
  struct PlaceAttempt {
    grpc::ClientContext context;
    v1::PlaceRequest request;
    v1::PlaceResponse response;
  };

  void OnPlaced(const grpc::Status& grpc_status, const PlaceAttempt& attempt) {
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
    }
    if (aborted) return FinishAborted();
    std::optional<v1::PlaceResponse> fallback;  // placed by the router itself
    absl::Status s = rpc::FromGrpcStatus(grpc_status);
    if (!s.ok()) {
      if (source_.metrics_) source_.metrics_->CountUpstreamError("place", s.code());
      if (source_.fallback_ && FallbackPlacer::ShouldFallBack(grpc_status)) {
        absl::StatusOr<v1::PlaceResponse> placed = source_.fallback_->Place(attempt.request);
        if (placed.ok()) {
          source_.num_fallback_placements_.fetch_add(1);
          KVMESH_LOG(kDebug) << "placed by the router from its worker view" << LogKv("request", request_.request_id)
                             << LogKv("scheduler_error", s.message());
          fallback = std::move(*placed);
        } else {
          s = absl::Status(s.code(), absl::StrCat(s.message(), "; nor could the router place it from its last view "
                                                             "of the workers: ", placed.status().message()));
        }
      }
    }
    if (!s.ok() && !fallback) {
      if (!last_error_.ok()) {  // a retry found no other worker: report why it was retried
        return FinishWith(absl::Status(last_error_.code(), absl::StrCat(last_error_.message(),
                                                                        "; no other worker could take the request: ",
                                                                        s.message())));
      }
      return FinishWith(absl::Status(s.code(), absl::StrCat("placement failed: ", s.message())));
    }
    const v1::PlaceResponse& placed = fallback ? *fallback : attempt.response;
    KVMESH_LOG(kDebug) << "placed" << LogKv("request", request_.request_id)
                       << LogKv("decode", placed.decode_worker().address())
                       << LogKv("prefill", placed.prefill_worker().address())
                       << LogKv("local", placed.prefill_locally()) << LogKv("attempt", attempts_);
    decode_id_ = placed.decode_worker().worker_id();
    decode_address_ = placed.decode_worker().address();
    v1::WorkerGenerateRequest generate;
    generate.set_request_id(request_.request_id);
    generate.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(), request_.prompt_token_ids.end());
    rpc::SamplingParamsToProto(request_.sampling_params, generate.mutable_sampling());
    generate.mutable_sampling()->set_n(request_.n);
    generate.set_prefill_worker_address(placed.prefill_worker().address());
    generate.set_prefill_locally(placed.prefill_locally());
    generate.set_kv_transport(placed.kv_transport());
    generate.set_priority(request_.priority);
    if (request_.arrival_order >= 0) generate.set_arrival_order(request_.arrival_order);
    generate.mutable_eos_token_ids()->Add(request_.eos_token_ids.begin(), request_.eos_token_ids.end());
    generate.set_cache_salt(request_.cache_salt);  // also on a migrated attempt: its prefix lookup needs it
    if (!resume_.empty()) {
      // Migrated: the decode worker prefills prompt + these and goes on from there.
      generate.mutable_resume_output_token_ids()->Add(resume_.begin(), resume_.end());
      generate.set_prefill_locally(true);
    }
    auto stream = std::make_shared<Stream>(shared_from_this(), source_.Channel(decode_address_), std::move(generate),
                                           source_.options_.generate_timeout_ms);
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
      if (!aborted) {
        current_context_ = &stream->context();
        stream_ = stream;  // lives as long as this Call (see Abort)
      }
    }
    if (aborted) return FinishAborted();  // outside mu_, as in Place()
    stream->Start();
  }

  void Emit(const v1::WorkerGenerateResponse& response) {
    engine::RequestOutput out;
    out.request_id = request_.request_id;
    const int32_t index = response.index();
    if (index < 0 || index >= request_.n) return;
    engine::CompletionOutput c;
    c.index = index;
    c.new_token_ids.assign(response.token_ids().begin(), response.token_ids().end());
    std::vector<int32_t>& all = tokens_[static_cast<size_t>(index)];
    all.insert(all.end(), c.new_token_ids.begin(), c.new_token_ids.end());  // for a migration
    for (const v1::TokenLogprob& lp : response.logprobs()) c.new_logprobs.push_back(rpc::SampleResultFromProto(lp));
    c.finish_reason = rpc::FinishReasonFromProto(response.finish_reason());
    if (response.has_stop_token_id()) c.stop_token_id = response.stop_token_id();
    if (response.num_prompt_tokens() > 0) num_prompt_tokens_ = response.num_prompt_tokens();
    if (response.num_cached_tokens() > 0) num_cached_tokens_ = response.num_cached_tokens();
    out.num_prompt_tokens = num_prompt_tokens_;
    out.num_cached_prompt_tokens = num_cached_tokens_;
    if (c.finished()) ++num_finished_;
    out.outputs.push_back(std::move(c));
    if (num_finished_ >= request_.n) out.finished = true;
    Deliver(out);
  }

  // Why a request that streamed tokens cannot move to another decode worker; empty
  // when it can (one sample, not finished, tokens left to generate).
  std::string MigrationRefusal() const {
    if (request_.n != 1) return "n > 1";
    if (num_finished_ > 0) return "it had finished";
    if (static_cast<int64_t>(tokens_[0].size()) >= request_.sampling_params.max_tokens) return "no tokens left";
    return "";
  }

  void FinishAborted() {
    engine::RequestOutput out;
    out.request_id = request_.request_id;
    out.num_prompt_tokens = num_prompt_tokens_;
    out.num_cached_prompt_tokens = num_cached_tokens_;
    for (int32_t i = 0; i < request_.n; ++i) {
      engine::CompletionOutput c;
      c.index = i;
      c.finish_reason = engine::CompletionFinishReason::kAbort;
      out.outputs.push_back(std::move(c));
    }
    out.finished = true;
    Deliver(out);
  }

  void FinishWith(const absl::Status& status) {
    engine::RequestOutput out;
    out.request_id = request_.request_id;
    out.num_prompt_tokens = num_prompt_tokens_;
    out.num_cached_prompt_tokens = num_cached_tokens_;
    out.finished = true;
    if (!status.ok()) {
      out.status = status;
    } else if (num_finished_ < request_.n) {
      out.status = absl::UnavailableError("the decode worker ended the stream before every sample finished");
    }
    Deliver(out);
  }

  // Delivers `out` unless the final output went already; forgets the call after the final.
  void Deliver(const engine::RequestOutput& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (final_delivered_) return;
      if (out.finished) final_delivered_ = true;
    }
    if (request_.on_output) request_.on_output(out);
    if (out.finished) source_.Forget(request_.request_id);
  }

  RemoteTokenSource& source_;
  engine::EngineRequest request_;
  // Attempt-side state: touched by one gRPC callback at a time (attempts and their
  // reads are sequential).
  std::vector<std::string> excluded_;  // decode workers found unreachable
  absl::Status last_error_;            // why the latest retry happened
  std::string decode_id_;
  std::string decode_address_;
  bool streamed_ = false;  // a response arrived: from here on a retry is a migration
  std::vector<int32_t> resume_;  // the tokens a migrated attempt resumes from
  std::vector<std::vector<int32_t>> tokens_;
  int32_t num_finished_ = 0;
  int32_t num_prompt_tokens_ = 0;
  int32_t num_cached_tokens_ = 0;
  std::mutex mu_;
  int32_t attempts_ = 0;                              // guarded by mu_ (read unlocked by the attempt side)
  std::vector<std::shared_ptr<PlaceAttempt>> place_attempts_;  // guarded by mu_
  std::shared_ptr<Stream> stream_;                    // guarded by mu_
  grpc::ClientContext* current_context_ = nullptr;    // guarded by mu_: what Abort() cancels
  bool aborted_ = false;                              // guarded by mu_
  bool final_delivered_ = false;                      // guarded by mu_
};

void RemoteTokenSource::Stream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  call_->OnResponse(response_);
  StartRead(&response_);
}

void RemoteTokenSource::Stream::OnDone(const grpc::Status& status) {
  // NOTE: the Call may hold the last reference to this stream, and this the last one
  // to the Call: nothing of this object is touched after the call below.
  std::shared_ptr<Call> call = std::move(call_);
  std::shared_ptr<grpc::Channel> channel = channel_;
  call->OnStreamDone(status, *channel);
}

RemoteTokenSource::RemoteTokenSource(RemoteTokenSourceOptions options, RouterMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      scheduler_channel_(rpc::CreateChannel(options_.scheduler_address)),
      scheduler_(v1::Scheduler::NewStub(scheduler_channel_)) {
  if (options_.placement_view_refresh_ms > 0) {
    fallback_ = std::make_unique<FallbackPlacer>(
        FallbackPlacerOptions{.model = options_.model, .refresh_interval_ms = options_.placement_view_refresh_ms},
        scheduler_channel_);
  }
}

RemoteTokenSource::~RemoteTokenSource() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) call->Abort();
  calls.clear();
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return calls_.empty() && live_calls_ == 0 && pending_reports_ == 0; });
}

absl::Status RemoteTokenSource::Submit(engine::EngineRequest request) {
  if (draining_.load()) return absl::UnavailableError("the router is draining; retry on another replica");
  if (absl::Status s = engine::ValidateEngineRequest(request, options_.limits); !s.ok()) return s;
  // NOTE: the deleter runs after the Call and everything it owns (its streams, their
  // stubs and contexts) is gone, on whichever gRPC thread dropped the last reference;
  // the destructor waits for it, since a gRPC object outliving main() aborts the
  // process at exit (ref_counted.h "prior > 0", seen in deploy_chart_processes).
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_calls_;
  }
  std::shared_ptr<Call> call(new Call(*this, std::move(request)), [this](Call* c) {
    delete c;
    std::lock_guard<std::mutex> lock(mu_);
    if (--live_calls_ == 0) idle_cv_.notify_all();
  });
  const std::string id = call->request_id();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (calls_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("request '", id, "' is already running"));
    calls_[id] = call;
  }
  call->Place();
  return absl::OkStatus();
}

void RemoteTokenSource::Abort(const std::string& request_id) {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = calls_.find(request_id);
    if (it == calls_.end()) return;
    call = it->second;
  }
  call->Abort();
}

int64_t RemoteTokenSource::num_inflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

void RemoteTokenSource::LogInflight() const {
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, call] : calls_) calls.push_back(call);
  }
  for (const auto& call : calls) {
    KVMESH_LOG(kWarning) << "in-flight call" << LogKv("request", call->request_id())
                         << LogKv("stage", call->DescribeStage());
  }
}

bool RemoteTokenSource::WaitIdle(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return calls_.empty(); });
}

std::shared_ptr<grpc::Channel> RemoteTokenSource::Channel(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& channel = channels_[address];
  if (!channel) channel = rpc::CreateChannel(address);
  return channel;
}

void RemoteTokenSource::ReportUnreachable(const std::string& worker_id, std::string_view reason) {
  if (worker_id.empty()) return;
  struct Pending {
    grpc::ClientContext context;
    v1::ReportUnreachableRequest request;
    v1::ReportUnreachableResponse response;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_reports_;
  }
  // Counted down when the call's state is destroyed (after the callback, with the
  // lambda that holds it), not in the callback: the context must not outlive this.
  std::shared_ptr<Pending> pending(new Pending, [this](Pending* p) {
    delete p;
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_reports_ == 0) idle_cv_.notify_all();
  });
  pending->request.set_worker_id(worker_id);
  pending->request.set_reporter("router");
  pending->request.set_reason(std::string(reason));
  rpc::SetTimeout(&pending->context, options_.place_timeout_ms);
  // Fire and forget (the heartbeat expiry covers a report that does not arrive), but
  // counted, so the destructor outwaits it.
  v1::ReportUnreachableRequest* request = &pending->request;
  v1::ReportUnreachableResponse* response = &pending->response;
  grpc::ClientContext* context = &pending->context;
  scheduler_->async()->ReportUnreachable(context, request, response,
                                         [pending = std::move(pending)](grpc::Status) {});
}

void RemoteTokenSource::Forget(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(request_id);
  if (calls_.empty()) idle_cv_.notify_all();
}

}  // namespace kvmesh::router
