// What a caller hands the continuous-batching engine (EngineRequest) and what it gets
// back every step (RequestOutput): the vocabulary between libs/engine and a service
// that streams tokens to clients.
//
// A request asks for `n` parallel samples of one prompt. Each step the engine emits at
// most one RequestOutput per request, carrying one CompletionOutput per sample that
// changed in that step (new tokens, or a finish). The last output of a request has
// finished() == true; after it the request id is free again.
//
// Thread-safety: plain values. The streaming callback runs on the engine thread (see
// EngineRequest::on_output).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/sampler.h"
#include "kv/kv_types.h"

namespace kvmesh::engine {

struct RequestOutput;

// Why a sample ended. kStop / kLength mirror the sampler's FinishReason; kAbort and
// kError are the engine's own (the client left or the request failed).
// NOTE: sampler.h's FinishReason has no abort/error; this superset keeps that file as is.
enum class CompletionFinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };

// "stop", "length", "abort", "error", or "" for kNone (OpenAI's / vLLM's finish_reason).
std::string_view CompletionFinishReasonName(CompletionFinishReason reason);
CompletionFinishReason ToCompletionFinishReason(FinishReason reason);

struct EngineRequest {
  std::string request_id;                // unique among the engine's unfinished requests
  std::vector<int32_t> prompt_token_ids;  // non-empty, each in [0, vocab_size)
  SamplingParams sampling_params;
  // Parallel samples of the prompt (OpenAI's `n`). The prompt is prefilled once and its
  // KV blocks are shared by the samples. When sampling_params.seed is set, sample i is
  // seeded with seed + i (so sample 0 reproduces an n == 1 request).
  int32_t n = 1;
  // Lower runs sooner, as in vLLM. Used by SchedulerOptions::Policy::kPriority only.
  int32_t priority = 0;
  // Tie-break among equal priorities; < 0: the engine assigns its own arrival counter.
  // (A value carried from another process, e.g. the router's receive order.)
  int64_t arrival_order = -1;
  // Tokens that end a sample with "stop" unless sampling_params.ignore_eos.
  std::vector<int32_t> eos_token_ids;
  // Resuming a request another engine started (migration after its worker died):
  // the output tokens it already produced, in order. They are prefilled after the
  // prompt, count against max_tokens and the penalties, and a seeded sampler skips one
  // draw per token, so the tokens that follow are those the first engine would have
  // produced. Not streamed again. n must be 1 and fewer than max_tokens.
  std::vector<int32_t> resume_output_token_ids;
  // vLLM's cache_salt: this request shares cached KV (every tier, the kv-store, a
  // P/D handoff's skipped blocks) only with requests of the same salt, because it
  // enters the chained block hashes (kv/block_hash.h). "" = none (shares with all
  // unsalted requests, as before). At most kMaxCacheSaltBytes (core/cache_salt.h).
  std::string cache_salt;
  // Called on the engine thread with every output of this request, in order, the final
  // one included (also for aborts and errors), during Engine::Step / Engine::Abort and
  // before they return. It must not call back into the Engine; post to a queue instead.
  std::function<void(const RequestOutput&)> on_output;
};

// One sample's progress.
struct CompletionOutput {
  int32_t index = 0;                   // sample index in [0, n)
  // Generated in this step (usually one). NOTE: the whole list is not repeated here:
  // copying it every step made a request's outputs cost O(tokens^2); a consumer that
  // needs it keeps its own (the router does, for migration).
  std::vector<int32_t> new_token_ids;
  // One entry per new token when sampling_params.logprobs >= 0 (chosen token's logprob,
  // rank and the top-N), else empty.
  std::vector<SampleResult> new_logprobs;
  CompletionFinishReason finish_reason = CompletionFinishReason::kNone;
  std::optional<int32_t> stop_token_id;  // the stop_token_ids entry that finished it (vLLM's stop_reason)

  bool finished() const { return finish_reason != CompletionFinishReason::kNone; }
};

// What a prefill-only request (Engine::AddPrefillOnlyRequest) hands to the decode side
// once its prompt is computed: the first token and where the prompt's KV sits in this
// engine's pool. The blocks stay pinned until Engine::ReleasePrefill (or Abort, or the
// release timeout).
struct PrefillResult {
  int32_t first_token_id = 0;
  // The first token's logprobs when sampling_params.logprobs >= 0 (pass them on to
  // Engine::CommitRemotePrefill); nullopt otherwise.
  std::optional<SampleResult> first_token_logprobs;
  // This engine's blocks holding the prompt's KV, in position order: block i holds
  // positions [i * B, (i + 1) * B); the last one may be partly filled.
  std::vector<kv::BlockId> block_ids;
  // Prompt tokens this engine took from its own prefix cache (not recomputed).
  int32_t num_cached_tokens = 0;
  // Leading blocks the receiver already holds (skip_leading_tokens / B): need not be sent.
  int32_t num_skipped_blocks = 0;
};

// When the engine reached each milestone of a request (steady_clock, this process).
// A default time_point (zero since the epoch) means not reached yet, or not known
// (an output that crossed a process boundary). Serving turns these into the queue,
// prefill and decode time histograms (docs/operating.md, "Metrics").
struct RequestTimes {
  std::chrono::steady_clock::time_point arrival;          // added to the engine
  std::chrono::steady_clock::time_point first_scheduled;  // first admitted to a step (or its remote KV slots)
  std::chrono::steady_clock::time_point first_token;      // its first output token was reported
  std::chrono::steady_clock::time_point finished;         // its final output was reported
};

struct RequestOutput {
  std::string request_id;
  // The samples that changed in this step, by increasing index.
  std::vector<CompletionOutput> outputs;
  int32_t num_prompt_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache at the request's first scheduling
  // (OpenAI usage.prompt_tokens_details.cached_tokens). 0 before that.
  int32_t num_cached_prompt_tokens = 0;
  // True on the request's last output: every sample has finished (or it was aborted or
  // failed).
  bool finished = false;
  // Why the request failed (finish_reason kError); OK otherwise.
  absl::Status status;
  // The request's milestones so far (all four on the final output).
  RequestTimes times;
  // vLLM's prompt_logprobs, on the one output that carries the first sampled token when
  // sampling_params.prompt_logprobs >= 0 (empty otherwise): entry i is prompt token i + 1
  // given tokens 0..i (the first prompt token has none), with the top alternatives.
  std::vector<SampleResult> prompt_logprobs;
  // Set on the one output of a prefill-only request that reports its computed prompt
  // (not final: the request ends with ReleasePrefill / Abort / the release timeout).
  std::optional<PrefillResult> prefill_result;
};

}  // namespace kvmesh::engine
