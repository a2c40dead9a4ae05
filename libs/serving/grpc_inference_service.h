// GrpcInferenceService: the gRPC front door (kvmesh.v1.Inference) over a TokenSource
// — the in-process AsyncEngine of `kvmesh serve`, or the cluster behind the router
// (RemoteTokenSource) — beside the REST front door (OpenAiService), which it
// mirrors: the same chat template, tokenizer, validation
// (engine::ValidateEngineRequest before anything is submitted), stop strings and
// usage through TextGenerationStream, and the same serving metrics.
//
//   Generate    server streaming: one GenerateResponse per sample step (token ids,
//               text delta, logprobs when asked); a sample's last message has its
//               finish_reason; with StreamOptions.include_usage the stream's last
//               message carries Usage. Prompts: text (special tokens added), chat
//               (chat template) or token ids (used as is); n samples interleave.
//   Tokenize    text or chat -> ids, as Generate would see them.
//   ListModels  the one served model.
//
// Errors (through rpc::ToGrpcStatus, the one conversion): INVALID_ARGUMENT naming
// the field ("sampling.temperature must be ...", "token_ids.ids[3]: ..."),
// NOT_FOUND for a model this server does not serve, UNAUTHENTICATED without a valid
// API key (when api_keys are set), RESOURCE_EXHAUSTED when admission refuses (full,
// a per-key rate limit or fair share: with a "retry-after" trailing metadata entry in
// seconds), UNIMPLEMENTED for logit_bias / prompt_logprobs, UNAVAILABLE while draining.
//
// Streaming (callback API, one ServerWriteReactor per call): the engine thread
// never blocks. Its outputs become messages queued on the call; one write is in
// flight at a time and the next starts from OnWriteDone. While a write is in
// flight, new deltas of the same sample are merged into the queued message
// (backpressure coalescing: a slow client receives fewer, larger messages). A
// client that cancels, or whose deadline passes, aborts the engine request at once
// (TokenSource::Abort: on the router, that cancels the decode worker's stream, which
// aborts the request on the workers), which frees its KV blocks. No lock is held
// while calling into gRPC or the token source.
//
// Thread-safety: thread-safe. The tokenizer, engine (token source) and metrics must
// outlive the service, and the service must outlive the grpc::Server it is registered
// with (a call's reactor is deleted only after both gRPC is done with it and the
// token source has delivered the request's final output).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "kvmesh/v1/api.grpc.pb.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serving/admission_controller.h"
#include "serving/serving_metrics.h"
#include "serving/token_source.h"

namespace kvmesh::serving {

struct GrpcInferenceServiceOptions {
  std::string model_name;               // what ListModels lists; requests may name it or leave model empty
  int32_t max_model_len = 0;            // prompt + completion tokens
  // Sequences (n) in flight beyond which Generate gets RESOURCE_EXHAUSTED; used only
  // when `admission` is null (the service then has a controller of its own).
  int32_t max_inflight_requests = 256;
  std::vector<int32_t> eos_token_ids;
  // Non-empty: every call needs "authorization: Bearer <key>" metadata with one of
  // them (UNAUTHENTICATED otherwise), as the REST front door's Authorization header.
  std::vector<std::string> api_keys;
  // Shared with the REST front door; must outlive the service. May be null.
  AdmissionController* admission = nullptr;
};

class GrpcInferenceService final : public v1::Inference::CallbackService {
 public:
  // `chat_template` may be empty: chat prompts then fail with INVALID_ARGUMENT
  // unless the request brings its own chat_template.
  GrpcInferenceService(const GrpcInferenceServiceOptions& options, const model::Tokenizer& tokenizer,
                       std::optional<model::ChatTemplate> chat_template, engine::AsyncEngine& engine,
                       ServingMetrics* metrics);
  // Over any token source (the router's cluster); `source` must outlive the service.
  GrpcInferenceService(const GrpcInferenceServiceOptions& options, const model::Tokenizer& tokenizer,
                       std::optional<model::ChatTemplate> chat_template, TokenSource& source,
                       ServingMetrics* metrics);
  ~GrpcInferenceService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                          const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context, const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

  // Generate calls whose reactor is alive (admitted, not yet done).
  int64_t inflight_requests() const { return inflight_.load(); }

 private:
  class GenerateReactor;
  friend class GenerateReactor;

  // Exactly one of `owned_source` and `source` is set.
  GrpcInferenceService(const GrpcInferenceServiceOptions& options, const model::Tokenizer& tokenizer,
                       std::optional<model::ChatTemplate> chat_template, std::unique_ptr<TokenSource> owned_source,
                       TokenSource* source, ServingMetrics* metrics);

  // The API key of the call ("" without api_keys); Unauthenticated when refused.
  absl::StatusOr<std::string> Authenticate(const grpc::CallbackServerContext& context) const;
  // NotFound unless `model` is empty or the served model.
  absl::Status CheckModel(const std::string& model) const;
  // The prompt text of a chat prompt (InvalidArgument naming the chat.* field).
  absl::StatusOr<std::string> RenderChat(const v1::ChatPrompt& chat) const;

  const GrpcInferenceServiceOptions options_;
  const model::Tokenizer& tokenizer_;
  const std::optional<model::ChatTemplate> chat_template_;
  std::unique_ptr<TokenSource> owned_source_;  // the AsyncEngine adapter, when given one
  TokenSource& source_;                         // where tokens come from
  ServingMetrics* metrics_;  // may be null
  std::unique_ptr<AdmissionController> owned_admission_;  // when options.admission is null
  AdmissionController& admission_;
  std::atomic<int64_t> inflight_{0};
  const int64_t created_unix_s_;
};

}  // namespace kvmesh::serving
