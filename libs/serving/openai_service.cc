#include "serving/openai_service.h"

#include <chrono>
#include <mutex>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/api_key.h"
#include "core/logging.h"
#include "engine/request_validator.h"
#include "http/api_error.h"
#include "http/openai_protocol.h"
#include "serving/request_ids.h"
#include "serving/text_generation_stream.h"

namespace kvmesh::serving {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The controller of a service not given a shared one: the default limits with the
// service's in-flight bound.
std::unique_ptr<AdmissionController> OwnAdmission(const OpenAiServiceOptions& options) {
  if (options.admission != nullptr) return nullptr;
  AdmissionOptions admission;
  admission.max_inflight_sequences = std::max(1, options.max_inflight_requests);
  return AdmissionController::Create(std::move(admission)).value();  // valid by construction
}

}  // namespace

// One client request: its engine requests (one per prompt), the text streams that
// turn their tokens into text, and the response being built or streamed.
struct OpenAiService::Call {
  OpenAiService* service = nullptr;
  std::shared_ptr<http::ResponseWriter> writer;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int32_t n = 1;             // samples per prompt the engine runs (best_of when given)
  int32_t return_n = 1;      // samples per prompt returned (n): the best of them by cumulative logprob
  bool want_logprobs = false;
  // Completions echo: each choice starts with its prompt (text; with logprobs its tokens,
  // the first one's logprob null). drop_generation: max_tokens 0, only the prompt.
  bool echo = false;
  bool drop_generation = false;
  bool want_prompt_logprobs = false;  // vLLM's prompt_logprobs field
  std::string cache_salt;             // vLLM's cache_salt: every prompt's engine request carries it
  std::vector<std::string> prompt_texts;  // per prompt, for echo
  std::vector<double> cumulative_logprob;  // per choice (best_of)
  std::vector<bool> echo_pending;          // per choice: the prompt not yet prepended
  http::ResponseMeta meta;
  Clock::time_point start = Clock::now();
  std::string api_key;                 // the admission key
  AdmissionController::Ticket ticket;  // held until Respond(); set before any engine request runs

  struct Sub {
    std::string engine_id;
    std::unique_ptr<TextGenerationStream> text;
    bool done = false;
    int32_t prompt_tokens = 0;
    Clock::time_point last_token;
    bool saw_token = false;
    std::vector<int32_t> prompt_ids;
    std::vector<http::TokenLogprob> echo_logprobs;  // the prompt's tokens, for echo with logprobs
  };

  std::mutex mu;
  std::vector<Sub> subs;                  // guarded by mu
  std::vector<http::Choice> choices;      // guarded by mu: accumulated (non-stream) or per-choice state
  std::vector<bool> role_sent;            // guarded by mu (chat streaming)
  int32_t remaining = 0;                  // guarded by mu: subs not done
  bool first_token_seen = false;          // guarded by mu
  std::optional<http::ApiError> failure;  // guarded by mu
  bool responded = false;                 // guarded by mu

  std::vector<http::TokenLogprob> RenderLogprobs(const std::vector<engine::SampleResult>& samples) const {
    std::vector<http::TokenLogprob> out;
    const model::Tokenizer& tok = service->tokenizer_;
    for (const engine::SampleResult& s : samples) {
      http::TokenLogprob lp;
      const int32_t id = s.token_id;
      lp.token = tok.Decode({&id, 1}, /*skip_special_tokens=*/false);
      lp.logprob = s.logprob.value_or(0.0f);
      for (const engine::TokenLogprob& t : s.top_logprobs) {
        const int32_t tid = t.token_id;
        lp.top.push_back({tok.Decode({&tid, 1}, false), t.logprob});
      }
      out.push_back(std::move(lp));
    }
    return out;
  }

  // The echoed prompt tokens with their logprobs (entry i - 1 of `lps` scores token i).
  std::vector<http::TokenLogprob> PromptTokenLogprobs(const std::vector<int32_t>& ids,
                                                      const std::vector<engine::SampleResult>& lps) const {
    const model::Tokenizer& tok = service->tokenizer_;
    std::vector<http::TokenLogprob> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      http::TokenLogprob lp;
      lp.token = tok.Decode({&ids[i], 1}, /*skip_special_tokens=*/false);
      if (i == 0 || i - 1 >= lps.size()) {
        lp.null_logprob = true;
      } else {
        const engine::SampleResult& s = lps[i - 1];
        lp.logprob = s.logprob.value_or(0.0f);
        for (const engine::TokenLogprob& t : s.top_logprobs) {
          const int32_t tid = t.token_id;
          lp.top.push_back({tok.Decode({&tid, 1}, false), t.logprob});
        }
      }
      out.push_back(std::move(lp));
    }
    return out;
  }

  std::vector<http::PromptTokenLogprobs> VllmPromptLogprobs(const std::vector<int32_t>& ids,
                                                            const std::vector<engine::SampleResult>& lps) const {
    const model::Tokenizer& tok = service->tokenizer_;
    std::vector<http::PromptTokenLogprobs> out;
    for (size_t i = 0; i < lps.size() && i + 1 < ids.size(); ++i) {
      http::PromptTokenLogprobs entry;
      const engine::SampleResult& s = lps[i];
      entry.entries.push_back({ids[i + 1], s.logprob.value_or(0.0f), s.rank, tok.Decode({&ids[i + 1], 1}, false)});
      for (size_t k = 0; k < s.top_logprobs.size(); ++k) {
        const engine::TokenLogprob& t = s.top_logprobs[k];
        entry.entries.push_back({t.token_id, t.logprob, static_cast<int32_t>(k + 1), tok.Decode({&t.token_id, 1}, false)});
      }
      out.push_back(std::move(entry));
    }
    return out;
  }

  // Puts prompt `p`'s echo in front of `delta` (a choice's first text).
  void PrependEcho(size_t p, http::Choice* delta) {
    const Sub& sub = subs[p];
    delta->text = prompt_texts[p] + delta->text;
    if (want_logprobs) {
      std::vector<http::TokenLogprob> lps = sub.echo_logprobs;
      if (delta->logprobs) lps.insert(lps.end(), delta->logprobs->begin(), delta->logprobs->end());
      delta->logprobs = std::move(lps);
    }
  }

  // Engine thread: one output of prompt `p`'s engine request.
  void OnOutput(size_t p, const engine::RequestOutput& out) {
    std::lock_guard<std::mutex> lock(mu);
    Sub& sub = subs[p];
    if (sub.done) return;
    if (!out.prompt_logprobs.empty() || (echo && !out.outputs.empty())) {
      if (echo && want_logprobs) sub.echo_logprobs = PromptTokenLogprobs(sub.prompt_ids, out.prompt_logprobs);
      if (want_prompt_logprobs && !out.prompt_logprobs.empty()) {
        const auto rendered = VllmPromptLogprobs(sub.prompt_ids, out.prompt_logprobs);
        for (int32_t i = 0; i < n; ++i) choices[p * n + i].prompt_logprobs = rendered;
      }
    }
    const Clock::time_point now = Clock::now();
    ServingMetrics* metrics = service->metrics_;
    std::vector<SampleDelta> deltas = sub.text->Consume(out);
    for (SampleDelta& d : deltas) {
      if (drop_generation) {  // max_tokens 0: the one token the engine had to make is not shown
        d.text.clear();
        d.logprobs.clear();
        if (d.finish_reason) d.finish_reason = "length";
      }
      for (const engine::SampleResult& s : d.logprobs) cumulative_logprob[p * n + d.index] += s.logprob.value_or(0.0f);
      if (!d.token_ids.empty()) {
        if (metrics) {
          if (!first_token_seen) metrics->ObserveTimeToFirstToken(SecondsBetween(start, now));
          if (sub.saw_token) metrics->ObserveInterTokenLatency(SecondsBetween(sub.last_token, now) / d.token_ids.size());
        }
        first_token_seen = true;
        sub.saw_token = true;
        sub.last_token = now;
      }
      const size_t index = p * n + d.index;
      http::Choice& acc = choices[index];
      http::Choice delta;
      delta.index = static_cast<int32_t>(index);
      delta.text = d.text;
      delta.text_offset = static_cast<int32_t>(acc.text.size());
      if (want_logprobs && !d.logprobs.empty()) delta.logprobs = RenderLogprobs(d.logprobs);
      if (d.finish_reason) delta.finish_reason = *d.finish_reason;
      if (echo && echo_pending[index]) {
        echo_pending[index] = false;
        PrependEcho(p, &delta);
      }
      if (delta.text_offset == 0 && delta.prompt_logprobs == std::nullopt && stream) {
        delta.prompt_logprobs = acc.prompt_logprobs;  // the first chunk carries them
        acc.prompt_logprobs.reset();
      }
      acc.text += delta.text;
      if (delta.logprobs) {
        if (!acc.logprobs) acc.logprobs.emplace();
        acc.logprobs->insert(acc.logprobs->end(), delta.logprobs->begin(), delta.logprobs->end());
      }
      if (d.finish_reason) {
        acc.finish_reason = *d.finish_reason;
        if (metrics) metrics->CountFinished(*d.finish_reason);
      }
      if (stream) WriteChunk(delta);
    }
    if (sub.text->needs_abort()) service->engine_.Abort(sub.engine_id);  // a stop string ended it
    if (out.finished) {
      sub.done = true;
      sub.prompt_tokens = out.num_prompt_tokens;
      if (metrics) metrics->ObserveFinishedRequest(out.times, out.num_prompt_tokens, sub.text->num_completion_tokens());
      if (!out.status.ok() && !failure) failure = http::ApiErrorFromStatus(out.status);
      if (--remaining == 0) Respond();
    }
  }

  void WriteChunk(const http::Choice& delta) {
    if (chat) {
      const bool first = !role_sent[delta.index];
      if (delta.text.empty() && !first && delta.finish_reason.empty() && !delta.logprobs) return;
      if (first && !delta.finish_reason.empty() && !delta.text.empty()) {
        // Content and finish in one delta: send the content first, then the finish alone.
        http::Choice content = delta;
        content.finish_reason.clear();
        writer->Write(http::ChatCompletionChunkEvent(meta, content, true, include_usage));
        http::Choice finish;
        finish.index = delta.index;
        finish.finish_reason = delta.finish_reason;
        writer->Write(http::ChatCompletionChunkEvent(meta, finish, false, include_usage));
      } else {
        writer->Write(http::ChatCompletionChunkEvent(meta, delta, first, include_usage));
      }
      role_sent[delta.index] = true;
    } else {
      if (delta.text.empty() && delta.finish_reason.empty() && !delta.logprobs) return;
      writer->Write(http::CompletionChunkEvent(meta, delta, include_usage));
    }
  }

  http::Usage Usage() const {
    http::Usage usage;
    int32_t cached = 0;
    for (const Sub& s : subs) {
      usage.prompt_tokens += s.text->num_prompt_tokens();
      usage.completion_tokens += drop_generation ? 0 : s.text->num_completion_tokens();
      cached += s.text->num_cached_prompt_tokens();
    }
    usage.cached_tokens = cached;
    return usage;
  }

  // best_of: of each prompt's n samples keep the return_n with the highest cumulative
  // logprob (ties: lower index), renumbered in that order as OpenAI does.
  void KeepBest() {
    if (return_n == n) return;
    std::vector<http::Choice> kept;
    for (size_t p = 0; p < subs.size(); ++p) {
      std::vector<int32_t> order(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return cumulative_logprob[p * n + a] > cumulative_logprob[p * n + b];
      });
      for (int32_t k = 0; k < return_n; ++k) {
        http::Choice c = std::move(choices[p * n + order[k]]);
        c.index = static_cast<int32_t>(kept.size());
        if (!want_logprobs) c.logprobs.reset();
        kept.push_back(std::move(c));
      }
    }
    choices = std::move(kept);
  }

  // Called once, with mu held, when every engine request has ended.
  void Respond() {
    if (responded) return;
    responded = true;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (echo && echo_pending[i] && !stream) {
        echo_pending[i] = false;
        PrependEcho(i / n, &choices[i]);
      }
    }
    KeepBest();
    const http::Usage usage = Usage();
    if (ServingMetrics* metrics = service->metrics_) {
      metrics->ObserveEndToEnd(SecondsBetween(start, Clock::now()));
      metrics->AddPromptTokens(usage.prompt_tokens);
      metrics->AddGenerationTokens(usage.completion_tokens);
    }
    if (stream) {
      if (failure) writer->Write(http::ErrorEvent(*failure));
      if (include_usage) {
        writer->Write(chat ? http::ChatCompletionUsageChunkEvent(meta, usage)
                           : http::CompletionUsageChunkEvent(meta, usage));
      }
      writer->Write(http::DoneEvent());
      writer->Finish();
    } else if (failure) {
      (void)writer->Send(http::ApiErrorResponse(*failure));
    } else {
      (void)writer->Send(http::HttpResponse::Json(200, chat ? http::ChatCompletionResponseJson(meta, choices, usage)
                                                            : http::CompletionResponseJson(meta, choices, usage)));
    }
    ticket = AdmissionController::Ticket();  // the sequences are no longer in flight
    service->inflight_.fetch_sub(1);
  }
};

OpenAiService::OpenAiService(const OpenAiServiceOptions& options, const model::Tokenizer& tokenizer,
                             std::optional<model::ChatTemplate> chat_template, engine::AsyncEngine& engine,
                             ServingMetrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      owned_source_(std::make_unique<AsyncEngineTokenSource>(engine)),
      engine_(*owned_source_),
      metrics_(metrics),
      owned_admission_(OwnAdmission(options)),
      admission_(options.admission != nullptr ? *options.admission : *owned_admission_),
      created_unix_(UnixSecondsNow()) {}

OpenAiService::OpenAiService(const OpenAiServiceOptions& options, const model::Tokenizer& tokenizer,
                             std::optional<model::ChatTemplate> chat_template, TokenSource& source,
                             ServingMetrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      engine_(source),
      metrics_(metrics),
      owned_admission_(OwnAdmission(options)),
      admission_(options.admission != nullptr ? *options.admission : *owned_admission_),
      created_unix_(UnixSecondsNow()) {}

std::optional<std::string> OpenAiService::Authorize(const http::HttpRequest& request,
                                                   http::ResponseWriter& writer) const {
  if (options_.api_keys.empty()) return std::string();
  const std::optional<std::string_view> header = request.headers.Get("Authorization");
  if (header) {
    if (const std::optional<std::string> key = MatchBearerKey(*header, options_.api_keys)) return key;
  }
  http::ApiError error;
  error.http_status = 401;
  error.type = "authentication_error";
  error.message = "Incorrect or missing API key: pass it as 'Authorization: Bearer <key>'.";
  error.code = "invalid_api_key";
  if (metrics_) metrics_->CountRejected(401);
  (void)writer.Send(http::ApiErrorResponse(error));
  return std::nullopt;
}

bool OpenAiService::CheckShape(const RequestShape& shape, http::ResponseWriter& writer) const {
  const absl::Status s = admission_.CheckShape(shape);
  if (s.ok()) return true;
  // "prompt: ..." / "stop[2]: ..." / "n: ...": the field is what precedes the colon.
  const std::string message(s.message());
  const size_t colon = message.find(": ");
  std::string param = colon == std::string::npos ? "" : message.substr(0, colon);
  const http::ApiError error = http::ApiErrorFromStatus(s, std::move(param));
  if (metrics_) metrics_->CountRejected(error.http_status);
  (void)writer.Send(http::ApiErrorResponse(error));
  return false;
}

bool OpenAiService::CheckModel(const std::string& model, http::ResponseWriter& writer) const {
  if (model.empty() || model == options_.model_name) return true;
  http::ApiError error;
  error.http_status = 404;
  error.type = "not_found_error";
  error.param = "model";
  error.code = "model_not_found";
  error.message = absl::StrCat("The model `", model, "` does not exist. This server serves `", options_.model_name, "`.");
  if (metrics_) metrics_->CountRejected(404);
  (void)writer.Send(http::ApiErrorResponse(error));
  return false;
}

namespace {

engine::SamplingParams ToSamplingParams(const http::SamplingFields& f, int32_t default_max_tokens) {
  engine::SamplingParams p;
  p.max_tokens = f.max_tokens.value_or(default_max_tokens);
  p.min_tokens = f.min_tokens.value_or(0);
  p.temperature = static_cast<float>(f.temperature.value_or(1.0));
  p.top_p = static_cast<float>(f.top_p.value_or(1.0));
  p.top_k = f.top_k.value_or(-1);
  if (p.top_k == 0) p.top_k = -1;
  p.min_p = static_cast<float>(f.min_p.value_or(0.0));
  if (f.seed) p.seed = static_cast<uint64_t>(*f.seed);
  p.presence_penalty = static_cast<float>(f.presence_penalty);
  p.frequency_penalty = static_cast<float>(f.frequency_penalty);
  p.repetition_penalty = static_cast<float>(f.repetition_penalty);
  p.stop_token_ids = f.stop_token_ids;
  p.ignore_eos = f.ignore_eos;
  for (const auto& [id, bias] : f.logit_bias) p.logit_bias.emplace_back(id, static_cast<float>(bias));
  if (f.prompt_logprobs) p.prompt_logprobs = *f.prompt_logprobs;
  return p;
}

}  // namespace

void OpenAiService::Start(std::shared_ptr<Call> call, std::vector<std::vector<int32_t>> prompts,
                          const engine::SamplingParams& params) {
  http::ResponseWriter& writer = *call->writer;
  if (draining_.load()) {
    http::ApiError error;
    error.http_status = 503;
    error.type = "service_unavailable_error";
    error.code = "draining";
    error.message = "The server is shutting down and admits no new requests; retry on another replica.";
    http::HttpResponse response = http::ApiErrorResponse(error);
    response.headers.Set("Retry-After", "1");
    if (metrics_) metrics_->CountRejected(503);
    (void)writer.Send(std::move(response));
    return;
  }
  {
    RequestShape shape{.num_prompts = static_cast<int64_t>(prompts.size()), .n = call->n,
                       .max_tokens = params.max_tokens};
    for (const std::vector<int32_t>& prompt : prompts) shape.prompt_tokens += static_cast<int64_t>(prompt.size());
    absl::StatusOr<AdmissionController::Ticket> ticket = admission_.Admit(call->api_key, shape);
    if (!ticket.ok()) {
      const http::ApiError error =
          http::ApiErrorFromStatus(ticket.status(), ticket.status().code() == absl::StatusCode::kInvalidArgument
                                                        ? "prompt"
                                                        : "");
      if (metrics_) metrics_->CountRejected(error.http_status);
      (void)writer.Send(http::ApiErrorResponse(error));
      return;
    }
    call->ticket = *std::move(ticket);
  }
  inflight_.fetch_add(1);
  // Build and validate every engine request before any runs, so that an invalid
  // prompt in a batch is a plain 400 with nothing started.
  std::vector<engine::EngineRequest> requests;
  for (size_t p = 0; p < prompts.size(); ++p) {
    engine::EngineRequest& r = requests.emplace_back();
    r.request_id = absl::StrCat(call->meta.id, "-", p);
    call->subs[p].engine_id = r.request_id;  // what a stop string aborts
    r.prompt_token_ids = std::move(prompts[p]);
    r.sampling_params = params;
    r.n = call->n;
    r.eos_token_ids = options_.eos_token_ids;
    r.cache_salt = call->cache_salt;
    absl::Status s = engine::ValidateEngineRequest(r, engine_.limits());
    if (s.ok() && r.prompt_token_ids.empty()) s = absl::InvalidArgumentError("the prompt is empty");
    if (!s.ok()) {
      inflight_.fetch_sub(1);
      const http::ApiError error = http::ApiErrorFromStatus(s, r.prompt_token_ids.empty() ? "prompt" : "");
      if (metrics_) metrics_->CountRejected(error.http_status);
      (void)writer.Send(http::ApiErrorResponse(error));
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(call->mu);
    call->remaining = static_cast<int32_t>(requests.size());
    call->choices.resize(requests.size() * call->n);
    call->role_sent.assign(call->choices.size(), false);
    call->cumulative_logprob.assign(call->choices.size(), 0.0);
    call->echo_pending.assign(call->choices.size(), call->echo);
    for (size_t p = 0; p < requests.size(); ++p) call->subs[p].prompt_ids = requests[p].prompt_token_ids;
    for (size_t i = 0; i < call->choices.size(); ++i) call->choices[i].index = static_cast<int32_t>(i);
  }
  if (call->stream) {
    http::HttpHeaders headers;
    headers.Set("Content-Type", "text/event-stream");
    headers.Set("Cache-Control", "no-cache");
    if (!writer.StartStream(200, std::move(headers)).ok()) {
      inflight_.fetch_sub(1);
      return;  // the client is gone
    }
  }
  std::weak_ptr<Call> weak = call;
  std::vector<std::string> ids;
  for (const engine::EngineRequest& r : requests) ids.push_back(r.request_id);
  // A client that goes away aborts its engine requests: their KV is freed at once.
  call->writer->SetOnDisconnect([this, ids] {
    for (const std::string& id : ids) engine_.Abort(id);
  });
  for (size_t p = 0; p < requests.size(); ++p) {
    engine::EngineRequest& r = requests[p];
    r.on_output = [call, p](const engine::RequestOutput& out) { call->OnOutput(p, out); };
    if (absl::Status s = engine_.Submit(std::move(r)); !s.ok()) {
      // Only possible while draining: end this prompt as failed.
      engine::RequestOutput out;
      out.request_id = ids[p];
      out.finished = true;
      out.status = absl::UnavailableError(absl::StrCat("the server is shutting down: ", s.message()));
      call->OnOutput(p, out);
    }
  }
}

void OpenAiService::HandleCompletions(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  std::optional<std::string> api_key = Authorize(request, *writer);
  if (!api_key) return;
  auto parsed = http::ParseCompletionRequest(request.body);
  if (auto* error = std::get_if<http::ApiError>(&parsed)) {
    if (metrics_) metrics_->CountRejected(error->http_status);
    (void)writer->Send(http::ApiErrorResponse(*error));
    return;
  }
  http::CompletionRequest& req = std::get<http::CompletionRequest>(parsed);
  if (!CheckModel(req.model, *writer)) return;
  // Before tokenizing: a 100,000-prompt array is refused without doing the work.
  if (!CheckShape({.num_prompts = static_cast<int64_t>(req.prompts.size()), .n = req.best_of.value_or(req.sampling.n),
                   .stop = &req.sampling.stop},
                  *writer)) {
    return;
  }
  auto call = std::make_shared<Call>();
  call->api_key = *std::move(api_key);
  call->service = this;
  call->writer = std::move(writer);
  call->stream = req.sampling.stream;
  call->include_usage = req.sampling.include_usage;
  call->return_n = req.sampling.n;
  call->n = req.best_of.value_or(req.sampling.n);
  call->cache_salt = req.sampling.cache_salt;
  call->meta = {NewResponseId("cmpl-"), UnixSecondsNow(), options_.model_name};
  engine::SamplingParams params = ToSamplingParams(req.sampling, options_.default_completion_max_tokens);
  if (req.logprobs) {
    params.logprobs = *req.logprobs;
    call->want_logprobs = true;
  }
  if (call->n > call->return_n && params.logprobs < 0) params.logprobs = 0;  // best_of ranks by them
  call->want_prompt_logprobs = req.sampling.prompt_logprobs.has_value();
  call->echo = req.echo;
  if (req.echo) {
    // The prompt's own logprobs (vLLM computes them for echo + logprobs the same way).
    if (req.logprobs) params.prompt_logprobs = std::max(params.prompt_logprobs, *req.logprobs);
    if (params.max_tokens == 0) {
      call->drop_generation = true;
      params.max_tokens = 1;  // the engine makes one token; it is not returned
      params.min_tokens = 0;
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const http::Prompt& p : req.prompts) {
    if (p.is_token_ids ? p.token_ids.empty() : p.text.empty()) {
      if (metrics_) metrics_->CountRejected(400);
      (void)call->writer->Send(http::ApiErrorResponse(http::ApiError::Invalid("prompt", "the prompt is empty")));
      return;
    }
    prompts.push_back(p.is_token_ids ? p.token_ids : tokenizer_.Encode(p.text, /*add_special_tokens=*/true));
    call->prompt_texts.push_back(p.is_token_ids ? tokenizer_.Decode(p.token_ids, /*skip_special_tokens=*/false) : p.text);
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    TextGenerationOptions text{.n = call->n, .stop = req.sampling.stop,
                               .skip_special_tokens = req.sampling.skip_special_tokens};
    Call::Sub sub;
    sub.text = std::make_unique<TextGenerationStream>(tokenizer_, text);
    call->subs.push_back(std::move(sub));
  }
  Start(std::move(call), std::move(prompts), params);
}

absl::StatusOr<std::string> OpenAiService::RenderChat(const http::ChatCompletionRequest& req) const {
  model::ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(req.template_messages_json);
  if (!req.tools_json.empty()) inputs.tools = nlohmann::ordered_json::parse(req.tools_json);
  inputs.add_generation_prompt = req.add_generation_prompt;
  const auto bos = tokenizer_.bos_token_id();
  const auto eos = tokenizer_.eos_token_id();
  inputs.tokens = model::ChatTemplateTokens{bos ? tokenizer_.IdToToken(*bos) : "",
                                            eos ? tokenizer_.IdToToken(*eos) : "</s>"};
  return chat_template_->Render(inputs);
}

void OpenAiService::HandleChatCompletions(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  std::optional<std::string> api_key = Authorize(request, *writer);
  if (!api_key) return;
  auto parsed = http::ParseChatCompletionRequest(request.body);
  if (auto* error = std::get_if<http::ApiError>(&parsed)) {
    if (metrics_) metrics_->CountRejected(error->http_status);
    (void)writer->Send(http::ApiErrorResponse(*error));
    return;
  }
  http::ChatCompletionRequest& req = std::get<http::ChatCompletionRequest>(parsed);
  if (!CheckModel(req.model, *writer)) return;
  if (!CheckShape({.num_prompts = 1, .n = req.sampling.n, .stop = &req.sampling.stop}, *writer)) return;
  if (!chat_template_) {
    (void)writer->Send(http::ApiErrorResponse(
        http::ApiError::Invalid("messages", "this model has no chat template; use /v1/completions")));
    return;
  }
  absl::StatusOr<std::string> text = RenderChat(req);
  if (!text.ok()) {
    (void)writer->Send(http::ApiErrorResponse(http::ApiErrorFromStatus(text.status(), "messages")));
    return;
  }
  std::vector<int32_t> prompt = tokenizer_.Encode(*text, /*add_special_tokens=*/false);
  auto call = std::make_shared<Call>();
  call->service = this;
  call->writer = std::move(writer);
  call->chat = true;
  call->api_key = *std::move(api_key);
  call->stream = req.sampling.stream;
  call->include_usage = req.sampling.include_usage;
  call->n = req.sampling.n;
  call->cache_salt = req.sampling.cache_salt;
  call->meta = {NewResponseId("chatcmpl-"), UnixSecondsNow(), options_.model_name};
  // vLLM's default for chat: whatever room the context leaves.
  const int32_t room = std::max<int32_t>(1, options_.max_model_len - static_cast<int32_t>(prompt.size()));
  engine::SamplingParams params = ToSamplingParams(req.sampling, room);
  if (req.logprobs) {
    params.logprobs = req.top_logprobs.value_or(0);
    call->want_logprobs = true;
  }
  TextGenerationOptions text_options{.n = call->n, .stop = req.sampling.stop,
                                     .skip_special_tokens = req.sampling.skip_special_tokens};
  Call::Sub sub;
  sub.text = std::make_unique<TextGenerationStream>(tokenizer_, text_options);
  call->subs.push_back(std::move(sub));
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(prompt));
  Start(std::move(call), std::move(prompts), params);
}

void OpenAiService::HandleModels(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  if (!Authorize(request, *writer)) return;  // (an optional: true when authorized)
  http::ModelCard card;
  card.id = options_.model_name;
  card.created = created_unix_;
  card.max_model_len = options_.max_model_len;
  (void)writer->Send(http::HttpResponse::Json(200, http::ModelListJson({card})));
}

void OpenAiService::HandleTokenize(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  if (!Authorize(request, *writer)) return;
  auto parsed = http::ParseTokenizeRequest(request.body);
  if (auto* error = std::get_if<http::ApiError>(&parsed)) {
    (void)writer->Send(http::ApiErrorResponse(*error));
    return;
  }
  http::TokenizeRequest& req = std::get<http::TokenizeRequest>(parsed);
  if (!CheckModel(req.model, *writer)) return;
  std::string text = req.prompt;
  if (req.is_chat) {
    if (!chat_template_) {
      (void)writer->Send(http::ApiErrorResponse(http::ApiError::Invalid("messages", "this model has no chat template")));
      return;
    }
    absl::StatusOr<std::string> rendered = RenderChat(req.chat);
    if (!rendered.ok()) {
      (void)writer->Send(http::ApiErrorResponse(http::ApiErrorFromStatus(rendered.status(), "messages")));
      return;
    }
    text = *std::move(rendered);
  }
  const std::vector<int32_t> ids = tokenizer_.Encode(text, req.add_special_tokens);
  std::vector<std::string> strs;
  if (req.return_token_strs) {
    for (int32_t id : ids) strs.push_back(tokenizer_.IdToToken(id));
  }
  (void)writer->Send(http::HttpResponse::Json(
      200, http::TokenizeResponseJson(ids, options_.max_model_len, req.return_token_strs ? &strs : nullptr)));
}

void OpenAiService::HandleDetokenize(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  if (!Authorize(request, *writer)) return;
  auto parsed = http::ParseDetokenizeRequest(request.body);
  if (auto* error = std::get_if<http::ApiError>(&parsed)) {
    (void)writer->Send(http::ApiErrorResponse(*error));
    return;
  }
  http::DetokenizeRequest& req = std::get<http::DetokenizeRequest>(parsed);
  if (!CheckModel(req.model, *writer)) return;
  for (size_t i = 0; i < req.tokens.size(); ++i) {
    if (req.tokens[i] >= tokenizer_.vocab_size()) {
      (void)writer->Send(http::ApiErrorResponse(http::ApiError::Invalid(
          absl::StrCat("tokens[", i, "]"),
          absl::StrCat("token id ", req.tokens[i], " is outside the vocabulary [0, ", tokenizer_.vocab_size(), ")"))));
      return;
    }
  }
  (void)writer->Send(
      http::HttpResponse::Json(200, http::DetokenizeResponseJson(tokenizer_.Decode(req.tokens, /*skip_special_tokens=*/false))));
}

void OpenAiService::HandleVersion(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  (void)request;
  (void)writer->Send(http::HttpResponse::Json(200, absl::StrCat("{\"version\":\"", kKvmeshVersion, "\"}")));
}

void OpenAiService::HandleHealth(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  if (draining_.load()) {
    (void)writer->Send(http::HttpResponse::Json(503, "{\"status\":\"draining\"}"));
    return;
  }
  (void)writer->Send(http::HttpResponse::Json(200, "{\"status\":\"ok\"}"));
}

}  // namespace kvmesh::serving
