// Admission checks for an EngineRequest, run before anything is queued or allocated
// (Engine::AddRequest; a router can run the same checks before forwarding).
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/request.h"
#include "engine/sampler.h"

namespace kvmesh::engine {

// What one engine can ever serve.
struct RequestLimits {
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;        // prompt + generated tokens per sample
  int32_t max_num_seqs = 0;         // n may not exceed it (the samples run side by side)
  int32_t num_kv_blocks = 0;        // the whole KV pool
  int32_t block_size_tokens = 0;
  int32_t max_logprobs = kDefaultMaxLogprobs;
  // The model runner computes logits at every prompt position (ModelRunner::
  // all_position_logits): without it prompt_logprobs is refused.
  bool prompt_logprobs_supported = true;
};

// KV blocks that `n` samples of `prompt_len` prompt tokens need when all run side by
// side to `prompt_len + max_tokens` tokens: the prompt's full blocks are shared once
// (fork), everything from the first partial prompt block on is per sample (copy-on-write).
int64_t PeakKvBlocks(int64_t prompt_len, int64_t max_tokens, int64_t n, int64_t block_size_tokens);

// OK, or the first problem found, in this order:
//   InvalidArgument: empty request_id; n < 1 or n > max_num_seqs; a cache_salt longer
//     than kMaxCacheSaltBytes; empty prompt; a prompt
//     token or EOS id outside [0, vocab_size); prompt longer than max_model_len (vLLM's
//     wording); sampling params that fail SamplingParams::Validate; prompt + max_tokens
//     beyond max_model_len (vLLM's wording); more KV blocks at peak (PeakKvBlocks) than
//     the whole pool.
// NOTE: a request that exceeds the whole KV pool is InvalidArgument, not
// ResourceExhausted: it can never run on this deployment, however long the client
// waits, so it must not look retryable (ResourceExhausted maps to HTTP 429 / gRPC
// RESOURCE_EXHAUSTED, which clients retry). It is the KV twin of "prompt longer than
// max_model_len". Requiring all n samples to fit side by side (rather than one at a
// time, which preemption could also serve) keeps a request from thrashing its own samples.
absl::Status ValidateEngineRequest(const EngineRequest& request, const RequestLimits& limits);

}  // namespace kvmesh::engine
