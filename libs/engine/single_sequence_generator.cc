#include "engine/single_sequence_generator.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<GenerationResult> GenerateSingleSequence(LlamaModel& model, std::span<const int32_t> prompt,
                                                        const SamplingParams& params,
                                                        std::span<const int32_t> eos_token_ids,
                                                        const std::function<bool(const GeneratedToken&)>& on_token,
                                                        DType kv_cache_dtype) {
  const auto& config = model.config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int64_t context = config.max_position_embeddings;
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len + params.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this model's maximum context length is ", context, " tokens, but ", prompt_len + params.max_tokens,
        " were requested (", prompt_len, " in the prompt, ", params.max_tokens, " in max_tokens)"));
  }
  KVMESH_ASSIGN_OR_RETURN(
      SequenceSampler sampler,
      SequenceSampler::Create(params, static_cast<int32_t>(config.vocab_size), prompt, eos_token_ids));
  const StopChecker stop_checker(params, eos_token_ids);
  KVMESH_ASSIGN_OR_RETURN(DenseKvCache cache, model.NewKvCache(prompt_len + params.max_tokens, kv_cache_dtype));

  GenerationResult result;
  result.num_prompt_tokens = static_cast<int32_t>(prompt_len);
  std::vector<float> logits;
  const int32_t last_row = static_cast<int32_t>(prompt_len - 1);
  const auto prefill_start = std::chrono::steady_clock::now();
  KVMESH_RETURN_IF_ERROR(model.Forward(prompt, cache, {&last_row, 1}, &logits));
  result.prefill_seconds = SecondsSince(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  const int32_t row0 = 0;
  for (;;) {
    GeneratedToken token;
    KVMESH_ASSIGN_OR_RETURN(token.sample, sampler.Sample(logits));
    sampler.Append(token.sample.token_id);
    ++result.num_output_tokens;
    token.stop = stop_checker.Check(token.sample.token_id, result.num_output_tokens);
    if (!on_token(token)) break;
    if (token.stop.finished()) {
      result.finish_reason = token.stop.reason;
      break;
    }
    logits.clear();
    KVMESH_RETURN_IF_ERROR(model.Forward({&token.sample.token_id, 1}, cache, {&row0, 1}, &logits));
  }
  result.decode_seconds = SecondsSince(decode_start);
  return result;
}

}  // namespace kvmesh::engine
