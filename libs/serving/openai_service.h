// OpenAiService: the OpenAI-compatible REST endpoints over a token generator
// (today the in-process AsyncEngine of `kvmesh serve`): /v1/completions,
// /v1/chat/completions (chat template), /v1/models, /health.
//
// Per request: authenticate (optional API keys), parse and validate (libs/http
// protocol), apply the chat template, tokenize, submit one engine request per
// prompt (each with n samples), and turn the engine's token outputs into text
// with TextGenerationStream — one JSON response, or SSE chunks ending in
// `data: [DONE]`. A client that disconnects aborts its engine requests, which
// frees their KV blocks at once. Admission (limits per request, sequences in flight,
// per-key rate limits and fair share) is the AdmissionController shared with the gRPC
// front door: a refusal is 400, or 429 with Retry-After.
//
// Thread-safety: handlers run on HTTP I/O threads and engine callbacks on the
// engine thread; all shared per-request state is behind a mutex. The tokenizer,
// engine and metrics must outlive the service.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "engine/sampler.h"
#include "http/http_types.h"
#include "http/openai_protocol.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serving/admission_controller.h"
#include "serving/serving_metrics.h"
#include "serving/token_source.h"

namespace kvmesh::serving {

// What /version reports.
inline constexpr char kKvmeshVersion[] = "0.1.0";

struct OpenAiServiceOptions {
  std::string model_name;          // what /v1/models lists and requests must name ("" in a request = this)
  int32_t max_model_len = 0;       // prompt + completion tokens
  std::vector<std::string> api_keys;  // empty: no authentication
  // Sequences (n x prompts) in flight beyond which requests get 429 + Retry-After;
  // used only when `admission` is null (the service then has a controller of its own).
  int32_t max_inflight_requests = 256;
  // Shared with the gRPC front door; must outlive the service. May be null.
  AdmissionController* admission = nullptr;
  int32_t default_completion_max_tokens = 16;  // OpenAI's default for /v1/completions
  std::vector<int32_t> eos_token_ids;
};

class OpenAiService {
 public:
  // `chat_template` may be empty: chat requests then fail with 400.
  OpenAiService(const OpenAiServiceOptions& options, const model::Tokenizer& tokenizer,
                std::optional<model::ChatTemplate> chat_template, engine::AsyncEngine& engine,
                ServingMetrics* metrics);
  // Over any token source (the router's cluster); `source` must outlive the service.
  OpenAiService(const OpenAiServiceOptions& options, const model::Tokenizer& tokenizer,
                std::optional<model::ChatTemplate> chat_template, TokenSource& source, ServingMetrics* metrics);

  void HandleCompletions(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  void HandleChatCompletions(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  void HandleModels(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  void HandleHealth(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  // vLLM's /tokenize, /detokenize and /version.
  void HandleTokenize(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  void HandleDetokenize(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);
  void HandleVersion(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer);

  int64_t inflight_requests() const { return inflight_.load(); }

  // Graceful drain has begun: /health answers 503 (so probes and load balancers
  // send traffic elsewhere) and new requests get 503 with Retry-After, while the
  // ones in flight finish. Irreversible.
  void StartDraining() { draining_.store(true); }

 private:
  struct Call;
  friend struct Call;

  // The API key the request authenticated with ("" without API keys); nullopt when
  // refused, the error response then has been sent.
  std::optional<std::string> Authorize(const http::HttpRequest& request, http::ResponseWriter& writer) const;
  // Refuses (400) a request whose shape exceeds the limits, before any tokenizing.
  bool CheckShape(const RequestShape& shape, http::ResponseWriter& writer) const;
  bool CheckModel(const std::string& model, http::ResponseWriter& writer) const;
  // The chat template over the request's messages and tools.
  absl::StatusOr<std::string> RenderChat(const http::ChatCompletionRequest& req) const;
  // Validates and submits one engine request per prompt, all with `params`.
  void Start(std::shared_ptr<Call> call, std::vector<std::vector<int32_t>> prompts,
             const engine::SamplingParams& params);

  const OpenAiServiceOptions options_;
  const model::Tokenizer& tokenizer_;
  const std::optional<model::ChatTemplate> chat_template_;
  std::unique_ptr<TokenSource> owned_source_;  // the AsyncEngine adapter, when given one
  TokenSource& engine_;                         // where tokens come from
  ServingMetrics* metrics_;  // may be null
  std::unique_ptr<AdmissionController> owned_admission_;  // when options.admission is null
  AdmissionController& admission_;
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> draining_{false};
  const int64_t created_unix_;
};

}  // namespace kvmesh::serving
