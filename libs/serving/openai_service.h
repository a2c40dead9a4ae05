// OpenAiService: the OpenAI-compatible REST endpoints over a token generator
// (today the in-process AsyncEngine of `kvmesh serve`): /v1/completions,
// /v1/chat/completions (chat template), /v1/models, /health.
//
// Per request: authenticate (optional API keys), parse and validate (libs/http
// protocol), apply the chat template, tokenize, submit one engine request per
// prompt (each with n samples), and turn the engine's token outputs into text
// with TextGenerationStream — one JSON response, or SSE chunks ending in
// `data: [DONE]`. A client that disconnects aborts its engine requests, which
// frees their KV blocks at once. A bounded number of requests may be in flight;
// beyond it the answer is 429 with Retry-After.
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
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serving/serving_metrics.h"
#include "serving/token_source.h"

namespace kvmesh::serving {

struct OpenAiServiceOptions {
  std::string model_name;          // what /v1/models lists and requests must name ("" in a request = this)
  int32_t max_model_len = 0;       // prompt + completion tokens
  std::vector<std::string> api_keys;  // empty: no authentication
  int32_t max_inflight_requests = 256;  // beyond: 429 + Retry-After
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

  int64_t inflight_requests() const { return inflight_.load(); }

  // Graceful drain has begun: /health answers 503 (so probes and load balancers
  // send traffic elsewhere) and new requests get 503 with Retry-After, while the
  // ones in flight finish. Irreversible.
  void StartDraining() { draining_.store(true); }

 private:
  struct Call;
  friend struct Call;

  // True when allowed; else the error response has been sent.
  bool Authorize(const http::HttpRequest& request, http::ResponseWriter& writer) const;
  bool CheckModel(const std::string& model, http::ResponseWriter& writer) const;
  // Validates and submits one engine request per prompt, all with `params`.
  void Start(std::shared_ptr<Call> call, std::vector<std::vector<int32_t>> prompts,
             const engine::SamplingParams& params);

  const OpenAiServiceOptions options_;
  const model::Tokenizer& tokenizer_;
  const std::optional<model::ChatTemplate> chat_template_;
  std::unique_ptr<TokenSource> owned_source_;  // the AsyncEngine adapter, when given one
  TokenSource& engine_;                         // where tokens come from
  ServingMetrics* metrics_;  // may be null
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  const int64_t created_unix_;
};

}  // namespace kvmesh::serving
