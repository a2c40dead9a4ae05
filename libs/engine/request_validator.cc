#include "engine/request_validator.h"

#include <algorithm>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "core/cache_salt.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t PeakKvBlocks(int64_t prompt_len, int64_t max_tokens, int64_t n, int64_t block_size_tokens) {
  const int64_t shared = prompt_len / block_size_tokens;
  const int64_t per_sample = CeilDiv(prompt_len + max_tokens, block_size_tokens) - shared;
  return shared + n * per_sample;
}

absl::Status ValidateEngineRequest(const EngineRequest& request, const RequestLimits& limits) {
  if (request.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (request.n < 1) return absl::InvalidArgumentError(absl::StrCat("n must be at least 1, got ", request.n));
  if (request.n > limits.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("n (", request.n, ") exceeds the engine's max_num_seqs (",
                                                   limits.max_num_seqs, "): the samples could never run together"));
  }
  // "" is "no salt" here (the front doors refused an empty one the client sent).
  if (!request.cache_salt.empty()) KVMESH_RETURN_IF_ERROR(ValidateCacheSalt(request.cache_salt));
  const std::vector<int32_t>& prompt = request.prompt_token_ids;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt must contain at least one token");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", prompt[i], " at position ", i,
                                                     " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  for (const int32_t id : request.eos_token_ids) {
    if (id < 0 || id >= limits.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos token id ", id, " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len > limits.max_model_len) {
    // vLLM's wording (vllm/v1/engine/processor.py).
    return absl::InvalidArgumentError(absl::StrCat("The decoder prompt (length ", prompt_len,
                                                   ") is longer than the maximum model length of ",
                                                   limits.max_model_len, "."));
  }
  if (absl::Status s = request.sampling_params.Validate(limits.vocab_size, limits.max_logprobs); !s.ok()) return s;
  if (request.sampling_params.prompt_logprobs >= 0 && !limits.prompt_logprobs_supported) {
    return absl::InvalidArgumentError(
        "prompt_logprobs is not supported here: this model runner (CUDA) or this path (router -> workers) "
        "returns logits of the last position only; `kvmesh serve` on the CPU runner computes them");
  }
  const int64_t max_tokens = request.sampling_params.max_tokens;
  if (prompt_len + max_tokens > limits.max_model_len) {
    // vLLM's OpenAI server wording (serving_engine.py).
    return absl::InvalidArgumentError(absl::StrCat(
        "This model's maximum context length is ", limits.max_model_len, " tokens. However, you requested ",
        prompt_len + max_tokens, " tokens (", prompt_len, " in the messages, ", max_tokens,
        " in the completion). Please reduce the length of the messages or completion."));
  }
  if (!request.resume_output_token_ids.empty()) {
    const int64_t resumed = static_cast<int64_t>(request.resume_output_token_ids.size());
    if (request.n != 1) return absl::InvalidArgumentError("a resumed request (resume_output_token_ids) needs n == 1");
    if (resumed >= max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("a resumed request carries ", resumed,
                                                     " output tokens: max_tokens (", max_tokens, ") must exceed it"));
    }
    for (size_t i = 0; i < request.resume_output_token_ids.size(); ++i) {
      const int32_t id = request.resume_output_token_ids[i];
      if (id < 0 || id >= limits.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("resumed output token id ", id, " at position ", i,
                                                       " is outside the vocabulary [0, ", limits.vocab_size, ")"));
      }
    }
  }
  const int64_t peak = PeakKvBlocks(prompt_len, max_tokens, request.n, limits.block_size_tokens);
  if (peak > limits.num_kv_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request needs ", peak, " KV cache blocks of ", limits.block_size_tokens, " tokens (n=", request.n, ", ",
        prompt_len, " prompt + ", max_tokens, " max_tokens) but the whole KV cache has ", limits.num_kv_blocks,
        "; reduce n, max_tokens or the prompt"));
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::engine
