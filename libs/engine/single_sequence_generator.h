// Runs one request start to finish on the dense path: prefill the prompt, then
// sample, check stop conditions and decode one token at a time.
//
// The foundation's generation loop (the CLI's `generate`, and the oracle the
// paged continuous-batching engine is compared with).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/statusor.h"
#include "engine/llama_model.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"

namespace kvmesh::engine {

struct GeneratedToken {
  SampleResult sample;
  StopDecision stop;  // finished() on the last token
};

struct GenerationResult {
  FinishReason finish_reason = FinishReason::kNone;  // kNone: the callback stopped it
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Calls `on_token` for every generated token, in order; returning false from it
// stops generation early. InvalidArgument (before any work) for an empty prompt,
// invalid sampling parameters, or prompt + max_tokens beyond the model's context
// (max_position_embeddings); errors from the model are passed through.
absl::StatusOr<GenerationResult> GenerateSingleSequence(LlamaModel& model, std::span<const int32_t> prompt,
                                                        const SamplingParams& params,
                                                        std::span<const int32_t> eos_token_ids,
                                                        const std::function<bool(const GeneratedToken&)>& on_token,
                                                        DType kv_cache_dtype = DType::kF32);

// The same loop on a paged runner (the CUDA runner, for `kvmesh generate --device cuda`):
// the one sequence owns blocks 0, 1, ... of the runner's pool, and a prompt longer than
// max_chunk_tokens is prefilled in chunks. InvalidArgument as above with `max_context`
// as the limit; ResourceExhausted when the pool is too small for prompt + max_tokens.
absl::StatusOr<GenerationResult> GenerateSingleSequenceOnRunner(
    ModelRunner& runner, int64_t max_context, int32_t max_chunk_tokens, std::span<const int32_t> prompt,
    const SamplingParams& params, std::span<const int32_t> eos_token_ids,
    const std::function<bool(const GeneratedToken&)>& on_token);

}  // namespace kvmesh::engine
