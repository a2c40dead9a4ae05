#include "remote_token_source.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "rpc/channel.h"
#include "rpc/sampling_conversions.h"
#include "rpc/status_conversion.h"

namespace kvmesh::cli {

// One request: Place, then the Generate stream. Kept alive by the source's table
// until its final output; gRPC callbacks hold a reference too.
class RemoteTokenSource::Call : public grpc::ClientReadReactor<v1::WorkerGenerateResponse>,
                                public std::enable_shared_from_this<Call> {
 public:
  Call(RemoteTokenSource& source, engine::EngineRequest request)
      : source_(source), request_(std::move(request)), tokens_(static_cast<size_t>(request_.n)) {}

  const std::string& request_id() const { return request_.request_id; }

  void Start() {
    place_request_.set_request_id(request_.request_id);
    place_request_.set_model(source_.options_.model);
    place_request_.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(), request_.prompt_token_ids.end());
    rpc::SetTimeout(&place_context_, source_.options_.place_timeout_ms);
    auto self = shared_from_this();
    source_.scheduler_->async()->Place(&place_context_, &place_request_, &place_response_,
                                       [self](grpc::Status status) { self->OnPlaced(status); });
  }

  void Abort() {
    bool generating;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
      generating = generating_;
    }
    if (generating) {
      generate_context_.TryCancel();
    } else {
      place_context_.TryCancel();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    Emit(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
    }
    if (aborted && !status.ok()) {
      FinishAborted();
    } else if (!status.ok()) {
      FinishWith(rpc::FromGrpcStatus(status));
    } else {
      FinishWith(absl::OkStatus());
    }
    self_.reset();
  }

 private:
  void OnPlaced(const grpc::Status& status) {
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = aborted_;
      if (!aborted && status.ok()) generating_ = true;
    }
    if (aborted) return FinishAborted();
    if (!status.ok()) {
      const absl::Status s = rpc::FromGrpcStatus(status);
      return FinishWith(absl::Status(s.code(), absl::StrCat("placement failed: ", s.message())));
    }
    KVMESH_LOG(kDebug) << "placed" << LogKv("request", request_.request_id)
                       << LogKv("decode", place_response_.decode_worker().address())
                       << LogKv("prefill", place_response_.prefill_worker().address())
                       << LogKv("local", place_response_.prefill_locally());
    generate_request_.set_request_id(request_.request_id);
    generate_request_.mutable_prompt_token_ids()->Add(request_.prompt_token_ids.begin(),
                                                      request_.prompt_token_ids.end());
    rpc::SamplingParamsToProto(request_.sampling_params, generate_request_.mutable_sampling());
    generate_request_.mutable_sampling()->set_n(request_.n);
    generate_request_.set_prefill_worker_address(place_response_.prefill_worker().address());
    generate_request_.set_prefill_locally(place_response_.prefill_locally());
    generate_request_.set_priority(request_.priority);
    if (request_.arrival_order >= 0) generate_request_.set_arrival_order(request_.arrival_order);
    generate_request_.mutable_eos_token_ids()->Add(request_.eos_token_ids.begin(), request_.eos_token_ids.end());
    rpc::SetTimeout(&generate_context_, source_.options_.generate_timeout_ms);
    stub_ = v1::Worker::NewStub(source_.Channel(place_response_.decode_worker().address()));
    self_ = shared_from_this();  // until OnDone
    stub_->async()->Generate(&generate_context_, &generate_request_, this);
    StartRead(&response_);
    StartCall();
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
    all.insert(all.end(), c.new_token_ids.begin(), c.new_token_ids.end());
    c.token_ids = all;
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

  void FinishAborted() {
    engine::RequestOutput out;
    out.request_id = request_.request_id;
    out.num_prompt_tokens = num_prompt_tokens_;
    out.num_cached_prompt_tokens = num_cached_tokens_;
    for (int32_t i = 0; i < request_.n; ++i) {
      engine::CompletionOutput c;
      c.index = i;
      c.token_ids = tokens_[static_cast<size_t>(i)];
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
  grpc::ClientContext place_context_;
  v1::PlaceRequest place_request_;
  v1::PlaceResponse place_response_;
  grpc::ClientContext generate_context_;
  v1::WorkerGenerateRequest generate_request_;
  v1::WorkerGenerateResponse response_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  std::shared_ptr<Call> self_;  // while the Generate stream runs
  // Read-side state: touched by one gRPC callback at a time (reads are sequential).
  std::vector<std::vector<int32_t>> tokens_;
  int32_t num_finished_ = 0;
  int32_t num_prompt_tokens_ = 0;
  int32_t num_cached_tokens_ = 0;
  std::mutex mu_;
  bool aborted_ = false;          // guarded by mu_
  bool generating_ = false;       // guarded by mu_
  bool final_delivered_ = false;  // guarded by mu_
};

RemoteTokenSource::RemoteTokenSource(RemoteTokenSourceOptions options)
    : options_(std::move(options)), scheduler_(v1::Scheduler::NewStub(rpc::CreateChannel(options_.scheduler_address))) {}

RemoteTokenSource::~RemoteTokenSource() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) call->Abort();
  calls.clear();
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return calls_.empty(); });
}

absl::Status RemoteTokenSource::Submit(engine::EngineRequest request) {
  if (absl::Status s = engine::ValidateEngineRequest(request, options_.limits); !s.ok()) return s;
  auto call = std::make_shared<Call>(*this, std::move(request));
  const std::string id = call->request_id();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (calls_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("request '", id, "' is already running"));
    calls_[id] = call;
  }
  call->Start();
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

void RemoteTokenSource::Forget(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(request_id);
  if (calls_.empty()) idle_cv_.notify_all();
}

}  // namespace kvmesh::cli
