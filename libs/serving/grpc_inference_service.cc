#include "serving/grpc_inference_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include "absl/strings/str_cat.h"
#include "core/cache_salt.h"
#include "core/logging.h"
#include "engine/request_validator.h"
#include "http/api_error.h"
#include "rpc/api_key_auth.h"
#include "rpc/sampling_conversions.h"
#include "rpc/status_conversion.h"
#include "core/retry_after.h"
#include "serving/request_ids.h"
#include "serving/text_generation_stream.h"

namespace kvmesh::serving {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// InvalidArgument "<field>: <message>".
absl::Status Invalid(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(field), ": ", AbslView(message)));
}

// The same status with "<prefix>" put before its message.
absl::Status Prefixed(std::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(AbslView(prefix), status.message()));
}

v1::FinishReason FinishReasonFromName(std::string_view name) {
  if (name == "stop") return v1::FINISH_REASON_STOP;
  if (name == "length") return v1::FINISH_REASON_LENGTH;
  if (name == "abort") return v1::FINISH_REASON_ABORT;
  return v1::FINISH_REASON_ERROR;
}

std::string_view ChatRole(const std::string& role) {
  return role == "developer" ? std::string_view("system") : std::string_view(role);
}

std::unique_ptr<AdmissionController> OwnAdmission(const GrpcInferenceServiceOptions& options) {
  if (options.admission != nullptr) return nullptr;
  AdmissionOptions admission;
  admission.max_inflight_sequences = std::max(1, options.max_inflight_requests);
  return AdmissionController::Create(std::move(admission)).value();  // valid by construction
}

}  // namespace

// One Generate call. Created by Generate() on a gRPC thread, fed by the engine
// thread, driven by gRPC's reactions. It deletes itself when gRPC is done with it
// (OnDone) and the engine has delivered the request's final output, whichever is
// later, so neither side can call into a deleted reactor.
class GrpcInferenceService::GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateReactor(GrpcInferenceService& service) : service_(service) {}

  // Validates the request and submits it to the engine; any error finishes the call.
  // Runs before Generate() returns the reactor, so gRPC cannot call OnDone meanwhile.
  void Start(grpc::CallbackServerContext& context, const v1::GenerateRequest& request) {
    absl::Status s;
    if (absl::StatusOr<std::string> key = service_.Authenticate(context); !key.ok()) {
      s = key.status();
    } else {
      s = Submit(*key, request);
    }
    if (!s.ok()) {
      if (const std::optional<int64_t> retry_after = RetryAfterSeconds(s)) {
        context.AddTrailingMetadata("retry-after", std::to_string(*retry_after));
      }
      if (service_.metrics_) service_.metrics_->CountRejected(http::HttpStatusFromStatusCode(s.code()));
      Action action;
      {
        std::lock_guard<std::mutex> lock(mu_);
        final_status_ = s;
        stream_ended_ = true;
        action = NextLocked();
      }
      Run(this, service_.source_, std::move(action));
    }
  }

  // NOTE (both reactions): the engine is read from this reactor before mu_ is released,
  // as OnDone does. Once it is released, OnDone may run and delete the reactor (gRPC
  // orders it after this reaction inside libgrpc++, where ThreadSanitizer cannot see
  // the order; through mu_ it can).
  void OnWriteDone(bool ok) override {
    TokenSource& engine = service_.source_;
    Action action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok) CancelLocked();  // the stream broke: the client is gone
      action = NextLocked();
    }
    Run(this, engine, std::move(action));
  }

  // The client cancelled, its deadline passed, or the server is shutting down.
  void OnCancel() override {
    TokenSource& engine = service_.source_;
    Action action;
    {
      std::lock_guard<std::mutex> lock(mu_);
      CancelLocked();
      action = NextLocked();
    }
    Run(this, engine, std::move(action));
  }

  void OnDone() override {
    TokenSource& engine = service_.source_;
    std::string abort_id;
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      last = engine_finished_;
      if (!engine_finished_) {
        CancelLocked();
        abort_id = TakeAbortLocked();
      }
    }
    // NOTE: once the lock is released the engine thread may delete this reactor
    // (when the final output arrives); only locals are used from here on.
    if (last) {
      delete this;
      return;
    }
    if (!abort_id.empty()) engine.Abort(abort_id);
  }

 private:
  // What to do after releasing mu_: abort the engine request, then start a write or
  // finish the call. Decided under mu_, done without it.
  struct Action {
    enum Kind { kNone, kWrite, kFinish };
    Kind kind = kNone;
    grpc::Status status;
    std::string abort_id;  // non-empty: abort this engine request
  };

  ~GenerateReactor() override {
    if (counted_) service_.inflight_.fetch_sub(1);
  }

  absl::Status Submit(const std::string& api_key, const v1::GenerateRequest& request) {
    GrpcInferenceService& svc = service_;
    if (absl::Status s = svc.CheckModel(request.model()); !s.ok()) return s;
    // An unset cache_salt is no salt; a set one follows the REST rule (non-empty, bounded).
    if (request.has_cache_salt()) {
      if (absl::Status s = ValidateCacheSalt(request.cache_salt()); !s.ok()) return Prefixed("cache_salt: ", s);
    }
    absl::StatusOr<engine::SamplingParams> params = rpc::SamplingParamsFromProto(request.sampling());
    if (!params.ok()) return params.status();  // messages already name sampling.*
    absl::StatusOr<int32_t> n = rpc::NumSamplesFromProto(request.sampling());
    if (!n.ok()) return n.status();
    const engine::RequestLimits& limits = svc.source_.limits();
    if (*n > limits.max_num_seqs) {
      return Invalid("sampling.n", absl::StrCat("must be at most ", limits.max_num_seqs,
                                                " (the engine's max_num_seqs), got ", *n));
    }
    if (absl::Status s = params->Validate(limits.vocab_size, limits.max_logprobs); !s.ok()) {
      return Prefixed("sampling.", s);  // "sampling.temperature must be ..."
    }
    const std::vector<std::string> stop(request.sampling().stop().begin(), request.sampling().stop().end());
    RequestShape shape{.num_prompts = 1, .n = *n, .max_tokens = params->max_tokens, .stop = &stop};
    // The shape before tokenizing: a refused request should not cost the work.
    if (absl::Status s = svc.admission_.CheckShape(shape); !s.ok()) return Prefixed("sampling.", s);

    const model::Tokenizer& tokenizer = svc.tokenizer_;
    const bool skip_special = request.sampling().skip_special_tokens();
    std::vector<int32_t> prompt;
    std::string prompt_field;
    switch (request.prompt_case()) {
      case v1::GenerateRequest::kText:
        prompt_field = "text";
        if (request.text().empty()) return Invalid("text", "the prompt is empty");
        prompt = tokenizer.Encode(request.text(), /*add_special_tokens=*/true);
        if (request.echo()) echo_ = request.text();
        break;
      case v1::GenerateRequest::kChat: {
        prompt_field = "chat.messages";
        absl::StatusOr<std::string> text = svc.RenderChat(request.chat());
        if (!text.ok()) return text.status();
        prompt = tokenizer.Encode(*text, /*add_special_tokens=*/false);  // the template wrote BOS
        if (request.echo()) echo_ = *text;
        break;
      }
      case v1::GenerateRequest::kTokenIds: {
        prompt_field = "token_ids.ids";
        const auto& ids = request.token_ids().ids();
        if (ids.empty()) return Invalid("token_ids.ids", "the prompt is empty");
        for (int i = 0; i < ids.size(); ++i) {
          if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
            return Invalid(absl::StrCat("token_ids.ids[", i, "]"),
                           absl::StrCat("token id ", ids[i], " is outside the vocabulary [0, ", limits.vocab_size, ")"));
          }
        }
        prompt.assign(ids.begin(), ids.end());
        if (request.echo()) echo_ = tokenizer.Decode(prompt, skip_special);
        break;
      }
      default:
        return Invalid("prompt", "set one of text, chat or token_ids");
    }
    if (prompt.empty()) return Invalid(prompt_field, "the prompt has no tokens");
    shape.prompt_tokens = static_cast<int64_t>(prompt.size());
    absl::StatusOr<AdmissionController::Ticket> ticket = svc.admission_.Admit(api_key, shape);
    if (!ticket.ok()) {
      if (ticket.status().code() == absl::StatusCode::kInvalidArgument) {
        return Prefixed(absl::StrCat(prompt_field, ": "), ticket.status());
      }
      return ticket.status();
    }
    ticket_ = *std::move(ticket);
    svc.inflight_.fetch_add(1);
    counted_ = true;

    const std::string serial = NewResponseId("grpc-");
    request_id_ = request.request_id().empty() ? serial : request.request_id();
    // NOTE: the engine id is ours, never the client's: two clients choosing the same
    // request_id must not collide in the engine (or abort each other).
    engine_id_ = serial;
    engine::EngineRequest r;
    r.request_id = engine_id_;
    r.prompt_token_ids = std::move(prompt);
    r.sampling_params = *params;
    r.n = *n;
    r.priority = request.priority();
    r.eos_token_ids = svc.options_.eos_token_ids;
    r.cache_salt = request.cache_salt();
    if (absl::Status s = engine::ValidateEngineRequest(r, limits); !s.ok()) {
      // What is left to fail here: the prompt's length, or prompt + max_tokens (context / KV pool).
      const bool prompt_too_long = static_cast<int64_t>(r.prompt_token_ids.size()) > limits.max_model_len;
      return Prefixed(prompt_too_long ? absl::StrCat(prompt_field, ": ") : "sampling.max_tokens: ", s);
    }

    const v1::StreamOptions& stream = request.stream_options();
    skip_text_ = stream.skip_text();
    include_usage_ = stream.include_usage();
    continuous_usage_ = stream.continuous_usage_stats();
    want_logprobs_ = params->logprobs >= 0;
    stop_.assign(request.sampling().stop().begin(), request.sampling().stop().end());
    include_stop_ = request.sampling().include_stop_str_in_output();
    text_ = std::make_unique<TextGenerationStream>(
        tokenizer, TextGenerationOptions{.n = *n, .stop = stop_, .skip_special_tokens = skip_special,
                                         .include_stop_str_in_output = include_stop_});
    first_sent_.assign(*n, false);
    sample_last_token_.assign(*n, Clock::time_point());
    sample_saw_token_.assign(*n, false);
    start_ = Clock::now();
    r.on_output = [this](const engine::RequestOutput& out) { OnEngineOutput(out); };
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_finished_ = false;  // from here on the engine holds a pointer to this reactor
    }
    if (absl::Status s = svc.source_.Submit(std::move(r)); !s.ok()) {
      // Submit refused it without keeping the callback: nothing will call back.
      std::lock_guard<std::mutex> lock(mu_);
      engine_finished_ = true;
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        return absl::UnavailableError(absl::StrCat("the server is shutting down: ", s.message()));
      }
      return s;
    }
    return absl::OkStatus();
  }

  // Engine thread: one output of the request.
  void OnEngineOutput(const engine::RequestOutput& out) {
    TokenSource& engine = service_.source_;
    Action action;
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stream_ended_) {
        ConsumeLocked(out);
        if (text_->all_finished() || out.finished) EndStreamLocked(out);
      }
      if (out.finished) {
        engine_finished_ = true;
        if (ServingMetrics* metrics = service_.metrics_) {
          metrics->ObserveFinishedRequest(out.times, out.num_prompt_tokens, text_->num_completion_tokens());
        }
        last = done_;  // gRPC is done with the call too: nobody else can reach it
      } else if (text_->needs_abort()) {
        action.abort_id = TakeAbortLocked();  // stop strings ended every sample
      }
      if (!last) {
        Action next = NextLocked();
        if (!action.abort_id.empty()) next.abort_id = std::move(action.abort_id);  // at most one is set
        action = std::move(next);
      }
    }
    if (last) {
      delete this;
      return;
    }
    // NOTE: from here on OnDone may delete this reactor on another thread (this
    // output may have been the final one); Run touches it only when it may.
    Run(this, engine, std::move(action));
  }

  // Every sample has its finish (a stop string may end them all before the engine's
  // final output, which then only confirms the abort): queue the usage, and finish
  // once the queue drains.
  void EndStreamLocked(const engine::RequestOutput& out) {
    stream_ended_ = true;
    final_status_ = out.finished ? out.status : absl::OkStatus();
    if (!cancelled_ && (include_usage_ || continuous_usage_)) {
      if (pending_.empty()) {
        v1::GenerateResponse& usage_only = pending_.emplace_back();
        usage_only.set_request_id(request_id_);
      }
      FillUsageLocked(pending_.back().mutable_usage());
    }
    if (ServingMetrics* metrics = service_.metrics_) {
      metrics->ObserveEndToEnd(SecondsBetween(start_, Clock::now()));
      metrics->AddPromptTokens(text_->num_prompt_tokens());
      metrics->AddGenerationTokens(text_->num_completion_tokens());
    }
  }

  void ConsumeLocked(const engine::RequestOutput& out) {
    const Clock::time_point now = Clock::now();
    if (!out.prompt_logprobs.empty()) prompt_logprobs_ = out.prompt_logprobs;
    ServingMetrics* metrics = service_.metrics_;
    std::vector<SampleDelta> deltas = text_->Consume(out);
    for (SampleDelta& d : deltas) {
      const size_t i = static_cast<size_t>(d.index);
      if (!d.token_ids.empty()) {
        if (metrics) {
          if (!first_token_seen_) metrics->ObserveTimeToFirstToken(SecondsBetween(start_, now));
          if (sample_saw_token_[i]) {
            metrics->ObserveInterTokenLatency(SecondsBetween(sample_last_token_[i], now) / d.token_ids.size());
          }
        }
        first_token_seen_ = true;
        sample_saw_token_[i] = true;
        sample_last_token_[i] = now;
      }
      if (d.finish_reason && metrics) metrics->CountFinished(*d.finish_reason);
      if (cancelled_) continue;  // nobody to send it to

      v1::GenerateResponse m;
      m.set_request_id(request_id_);
      m.set_index(d.index);
      m.mutable_token_ids()->Add(d.token_ids.begin(), d.token_ids.end());
      if (!skip_text_) {
        if (!first_sent_[i] && !echo_.empty()) {
          m.set_text(absl::StrCat(echo_, d.text));
        } else {
          m.set_text(std::move(d.text));
        }
      }
      if (!first_sent_[i]) {
        for (const engine::SampleResult& lp : prompt_logprobs_) AddLogprobLocked(lp, m.add_prompt_logprobs());
      }
      first_sent_[i] = true;
      if (want_logprobs_) {
        const model::Tokenizer& tok = service_.tokenizer_;
        for (const engine::SampleResult& lp : d.logprobs) {
          v1::TokenLogprob* p = m.add_logprobs();
          rpc::SampleResultToProto(lp, p);
          if (skip_text_) continue;
          const int32_t id = lp.token_id;
          p->set_token(tok.Decode({&id, 1}, /*skip_special_tokens=*/false));
          for (v1::TopLogprob& top : *p->mutable_top_logprobs()) {
            const int32_t tid = top.token_id();
            top.set_token(tok.Decode({&tid, 1}, /*skip_special_tokens=*/false));
          }
        }
      }
      if (d.finish_reason) {
        const v1::FinishReason reason = FinishReasonFromName(*d.finish_reason);
        m.set_finish_reason(reason);
        if (reason == v1::FINISH_REASON_STOP) SetStopReasonLocked(out, d, &m);
      }
      if (continuous_usage_) FillUsageLocked(m.mutable_usage());
      EnqueueLocked(std::move(m));
    }
  }

  // One logprob, with its tokens' text unless skip_text.
  void AddLogprobLocked(const engine::SampleResult& lp, v1::TokenLogprob* p) const {
    rpc::SampleResultToProto(lp, p);
    if (skip_text_) return;
    const model::Tokenizer& tok = service_.tokenizer_;
    const int32_t id = lp.token_id;
    p->set_token(tok.Decode({&id, 1}, /*skip_special_tokens=*/false));
    for (v1::TopLogprob& top : *p->mutable_top_logprobs()) {
      const int32_t tid = top.token_id();
      top.set_token(tok.Decode({&tid, 1}, /*skip_special_tokens=*/false));
    }
  }

  // What ended sample `d.index` with "stop": a stop string or a stop token (none for EOS).
  void SetStopReasonLocked(const engine::RequestOutput& out, const SampleDelta& d, v1::GenerateResponse* m) const {
    if (d.stop_string) {
      m->set_stop_string(*d.stop_string);
      return;
    }
    for (const engine::CompletionOutput& o : out.outputs) {
      if (o.index == d.index && o.stop_token_id) m->set_stop_token_id(*o.stop_token_id);
    }
  }

  // Queues `m`; merges it into the queued, unsent message of the same sample when
  // there is one (backpressure: the client is slower than the engine).
  void EnqueueLocked(v1::GenerateResponse m) {
    if (!pending_.empty()) {
      v1::GenerateResponse& back = pending_.back();
      if (back.index() == m.index() && back.finish_reason() == v1::FINISH_REASON_UNSPECIFIED) {
        back.mutable_token_ids()->MergeFrom(m.token_ids());
        back.mutable_text()->append(m.text());
        back.mutable_logprobs()->MergeFrom(m.logprobs());
        back.mutable_prompt_logprobs()->MergeFrom(m.prompt_logprobs());
        back.set_finish_reason(m.finish_reason());
        if (m.has_stop_token_id()) back.set_stop_token_id(m.stop_token_id());
        if (m.has_stop_string()) back.set_stop_string(m.stop_string());
        if (m.has_usage()) *back.mutable_usage() = m.usage();
        return;
      }
    }
    pending_.push_back(std::move(m));
  }

  void FillUsageLocked(v1::Usage* usage) const {
    usage->set_prompt_tokens(text_->num_prompt_tokens());
    usage->set_completion_tokens(text_->num_completion_tokens());
    usage->set_total_tokens(text_->num_prompt_tokens() + text_->num_completion_tokens());
    usage->set_cached_prompt_tokens(text_->num_cached_prompt_tokens());
  }

  // The client is gone: drop what is queued; the engine request is to be aborted.
  void CancelLocked() {
    cancelled_ = true;
    pending_.clear();
  }

  // The engine id to abort, once, while the engine still runs the request; else "".
  std::string TakeAbortLocked() {
    if (abort_sent_ || engine_finished_) return "";
    abort_sent_ = true;
    return engine_id_;
  }

  // The next step of the call: at most one write in flight; Finish once nothing is
  // queued and the stream has ended (at once when cancelled). Aborts a cancelled
  // call's engine request.
  Action NextLocked() {
    Action action;
    if (cancelled_) action.abort_id = TakeAbortLocked();
    if (write_in_flight_ || finish_called_) return action;
    if (cancelled_) {
      finish_called_ = true;
      action.kind = Action::kFinish;
      action.status = grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    } else if (!pending_.empty()) {
      writing_ = std::move(pending_.front());
      pending_.pop_front();
      write_in_flight_ = true;
      action.kind = Action::kWrite;
    } else if (stream_ended_) {
      finish_called_ = true;
      action.kind = Action::kFinish;
      action.status = rpc::ToGrpcStatus(final_status_);
    }
    return action;
  }

  // Carries out `action` without mu_. Static, with `engine` passed in, because with
  // kNone `self` may already be gone (deleted on another thread); with kWrite or
  // kFinish it cannot be: gRPC calls OnDone only after the write completes / Finish.
  static void Run(GenerateReactor* self, TokenSource& engine, Action action) {
    if (!action.abort_id.empty()) engine.Abort(action.abort_id);
    if (action.kind == Action::kWrite) {
      self->StartWrite(&self->writing_);  // gRPC's until OnWriteDone; nothing else touches it meanwhile
    } else if (action.kind == Action::kFinish) {
      self->Finish(action.status);
    }
  }

  GrpcInferenceService& service_;
  bool counted_ = false;  // counted in inflight_; set before the engine can call back
  AdmissionController::Ticket ticket_;  // the admitted sequences, released with the reactor

  // Fixed once Submit() has handed the request to the engine.
  std::string request_id_;  // the client's, or the one assigned
  std::string engine_id_;
  std::string echo_;  // prepended to each sample's first text
  std::vector<engine::SampleResult> prompt_logprobs_;  // guarded by mu_: sent on each sample's first message
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  bool skip_text_ = false;
  bool include_usage_ = false;
  bool continuous_usage_ = false;
  bool want_logprobs_ = false;
  Clock::time_point start_;

  std::mutex mu_;
  std::unique_ptr<TextGenerationStream> text_;         // guarded by mu_
  std::vector<bool> first_sent_;                       // guarded by mu_: per sample, echo applied
  std::vector<bool> sample_saw_token_;                 // guarded by mu_
  std::vector<Clock::time_point> sample_last_token_;   // guarded by mu_
  bool first_token_seen_ = false;                      // guarded by mu_
  std::deque<v1::GenerateResponse> pending_;           // guarded by mu_
  v1::GenerateResponse writing_;                       // gRPC's while write_in_flight_
  bool write_in_flight_ = false;                       // guarded by mu_
  bool engine_finished_ = true;   // guarded by mu_: no engine callback is outstanding
  bool abort_sent_ = false;       // guarded by mu_
  bool stream_ended_ = false;     // guarded by mu_: nothing more will be queued
  absl::Status final_status_;     // guarded by mu_
  bool cancelled_ = false;        // guarded by mu_: the client left
  bool finish_called_ = false;    // guarded by mu_
  bool done_ = false;             // guarded by mu_: OnDone has run
};

GrpcInferenceService::GrpcInferenceService(const GrpcInferenceServiceOptions& options,
                                           const model::Tokenizer& tokenizer,
                                           std::optional<model::ChatTemplate> chat_template,
                                           engine::AsyncEngine& engine, ServingMetrics* metrics)
    : GrpcInferenceService(options, tokenizer, std::move(chat_template),
                           std::make_unique<AsyncEngineTokenSource>(engine), nullptr, metrics) {}

GrpcInferenceService::GrpcInferenceService(const GrpcInferenceServiceOptions& options,
                                           const model::Tokenizer& tokenizer,
                                           std::optional<model::ChatTemplate> chat_template, TokenSource& source,
                                           ServingMetrics* metrics)
    : GrpcInferenceService(options, tokenizer, std::move(chat_template), nullptr, &source, metrics) {}

GrpcInferenceService::GrpcInferenceService(const GrpcInferenceServiceOptions& options,
                                           const model::Tokenizer& tokenizer,
                                           std::optional<model::ChatTemplate> chat_template,
                                           std::unique_ptr<TokenSource> owned_source, TokenSource* source,
                                           ServingMetrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      owned_source_(std::move(owned_source)),
      source_(source != nullptr ? *source : *owned_source_),
      metrics_(metrics),
      owned_admission_(OwnAdmission(options)),
      admission_(options.admission != nullptr ? *options.admission : *owned_admission_),
      created_unix_s_(UnixSecondsNow()) {}

GrpcInferenceService::~GrpcInferenceService() {
  if (const int64_t n = inflight_.load(); n != 0) {
    KVMESH_LOG(kError) << "GrpcInferenceService destroyed with Generate calls alive" << LogKv("calls", n);
  }
}

absl::StatusOr<std::string> GrpcInferenceService::Authenticate(const grpc::CallbackServerContext& context) const {
  return rpc::AuthenticateApiKey(context, options_.api_keys);
}

absl::Status GrpcInferenceService::CheckModel(const std::string& model) const {
  if (model.empty() || model == options_.model_name) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("model: `", model, "` is not served here; this server serves `", options_.model_name, "`"));
}

absl::StatusOr<std::string> GrpcInferenceService::RenderChat(const v1::ChatPrompt& chat) const {
  std::optional<model::ChatTemplate> custom;
  if (!chat.chat_template().empty()) {
    absl::StatusOr<model::ChatTemplate> t = model::ChatTemplate::FromJinja(chat.chat_template());
    if (!t.ok()) return Prefixed("chat.chat_template: ", t.status());
    custom = *t;
  }
  const model::ChatTemplate* tmpl = custom ? &*custom : (chat_template_ ? &*chat_template_ : nullptr);
  if (tmpl == nullptr) {
    return Invalid("chat", "this model has no chat template: send text or token_ids, or a chat.chat_template");
  }
  if (chat.messages().empty()) return Invalid("chat.messages", "at least one message is required");
  std::vector<model::ChatMessage> messages;
  for (const v1::ChatMessage& m : chat.messages()) {
    // The OpenAI roles, as REST accepts them: a template may render any role, but a
    // typo must be the client's error, not silently become a prompt.
    if (m.role() != "system" && m.role() != "developer" && m.role() != "user" && m.role() != "assistant" &&
        m.role() != "tool") {
      return Invalid("chat.messages", absl::StrCat("unknown role '", m.role(), "'"));
    }
    messages.push_back({std::string(ChatRole(m.role())), m.content()});
  }
  const auto bos = tokenizer_.bos_token_id();
  const auto eos = tokenizer_.eos_token_id();
  absl::StatusOr<std::string> text =
      tmpl->Apply(messages, chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true,
                  bos ? tokenizer_.IdToToken(*bos) : "", eos ? tokenizer_.IdToToken(*eos) : "</s>");
  if (!text.ok()) return Prefixed("chat.messages: ", text.status());
  return text;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GrpcInferenceService::Generate(grpc::CallbackServerContext* context,
                                                                             const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(*this);
  reactor->Start(*context, *request);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcInferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response) {
  if (absl::StatusOr<std::string> key = Authenticate(*context); !key.ok()) {
    return rpc::FinishUnary(context, key.status());
  }
  if (absl::Status s = CheckModel(request->model()); !s.ok()) return rpc::FinishUnary(context, s);
  std::vector<int32_t> ids;
  switch (request->prompt_case()) {
    case v1::TokenizeRequest::kText:
      ids = tokenizer_.Encode(request->text(),
                              request->has_add_special_tokens() ? request->add_special_tokens() : true);
      break;
    case v1::TokenizeRequest::kChat: {
      absl::StatusOr<std::string> text = RenderChat(request->chat());
      if (!text.ok()) return rpc::FinishUnary(context, text.status());
      // The template writes BOS itself, as Generate sees it.
      ids = tokenizer_.Encode(*text, request->has_add_special_tokens() ? request->add_special_tokens() : false);
      break;
    }
    default:
      return rpc::FinishUnary(context, Invalid("prompt", "set one of text or chat"));
  }
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  if (request->return_token_strings()) {
    for (const int32_t id : ids) response->add_token_strings(tokenizer_.IdToToken(id));
  }
  response->set_count(static_cast<int32_t>(ids.size()));
  response->set_max_model_len(options_.max_model_len);
  return rpc::FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GrpcInferenceService::ListModels(grpc::CallbackServerContext* context,
                                                           const v1::ListModelsRequest* request,
                                                           v1::ListModelsResponse* response) {
  if (absl::StatusOr<std::string> key = Authenticate(*context); !key.ok()) {
    return rpc::FinishUnary(context, key.status());
  }
  v1::ModelInfo* model = response->add_models();
  model->set_id(options_.model_name);
  model->set_owned_by("kvmesh");
  model->set_created_unix_s(created_unix_s_);
  model->set_max_model_len(options_.max_model_len);
  return rpc::FinishUnary(context, absl::OkStatus());
}

}  // namespace kvmesh::serving
