#include "engine/single_sequence_generator.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvmesh::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The generation loop over any forward pass: `forward(tokens, logits)` runs `tokens` at the
// next positions and returns the last one's logits.
using ForwardFn = std::function<absl::Status(std::span<const int32_t> tokens, std::vector<float>* logits)>;

absl::Status CheckContext(int64_t context, int64_t prompt_len, const SamplingParams& params) {
  if (prompt_len == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (prompt_len + params.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this model's maximum context length is ", context, " tokens, but ", prompt_len + params.max_tokens,
        " were requested (", prompt_len, " in the prompt, ", params.max_tokens, " in max_tokens)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationResult> GenerateLoop(int32_t vocab_size, std::span<const int32_t> prompt,
                                              const SamplingParams& params, std::span<const int32_t> eos_token_ids,
                                              const std::function<bool(const GeneratedToken&)>& on_token,
                                              const ForwardFn& forward) {
  KVMESH_ASSIGN_OR_RETURN(SequenceSampler sampler, SequenceSampler::Create(params, vocab_size, prompt, eos_token_ids));
  const StopChecker stop_checker(params, eos_token_ids);
  GenerationResult result;
  result.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  std::vector<float> logits;
  const auto prefill_start = std::chrono::steady_clock::now();
  KVMESH_RETURN_IF_ERROR(forward(prompt, &logits));
  result.prefill_seconds = SecondsSince(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
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
    KVMESH_RETURN_IF_ERROR(forward({&token.sample.token_id, 1}, &logits));
  }
  result.decode_seconds = SecondsSince(decode_start);
  return result;
}

}  // namespace

absl::StatusOr<GenerationResult> GenerateSingleSequence(LlamaModel& model, std::span<const int32_t> prompt,
                                                        const SamplingParams& params,
                                                        std::span<const int32_t> eos_token_ids,
                                                        const std::function<bool(const GeneratedToken&)>& on_token,
                                                        DType kv_cache_dtype) {
  const auto& config = model.config();
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  KVMESH_RETURN_IF_ERROR(CheckContext(config.max_position_embeddings, prompt_len, params));
  KVMESH_ASSIGN_OR_RETURN(DenseKvCache cache, model.NewKvCache(prompt_len + params.max_tokens, kv_cache_dtype));
  return GenerateLoop(static_cast<int32_t>(config.vocab_size), prompt, params, eos_token_ids, on_token,
                      [&](std::span<const int32_t> tokens, std::vector<float>* logits) {
                        const int32_t last_row = static_cast<int32_t>(tokens.size()) - 1;
                        return model.Forward(tokens, cache, {&last_row, 1}, logits);
                      });
}

absl::StatusOr<GenerationResult> GenerateSingleSequenceOnRunner(
    ModelRunner& runner, int64_t max_context, int32_t max_chunk_tokens, std::span<const int32_t> prompt,
    const SamplingParams& params, std::span<const int32_t> eos_token_ids,
    const std::function<bool(const GeneratedToken&)>& on_token) {
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  KVMESH_RETURN_IF_ERROR(CheckContext(max_context, prompt_len, params));
  if (max_chunk_tokens < 1) return absl::InvalidArgumentError("max_chunk_tokens must be >= 1");
  const int64_t block = runner.block_size_tokens();
  const int64_t blocks_needed = (prompt_len + params.max_tokens + block - 1) / block;
  if (blocks_needed > runner.num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV pool holds ", runner.num_blocks(), " blocks of ", block,
                                                     " tokens; this request needs ", blocks_needed));
  }
  // The one sequence owns blocks 0, 1, 2, ... of the pool.
  std::vector<int32_t> block_table(static_cast<size_t>(blocks_needed));
  for (size_t i = 0; i < block_table.size(); ++i) block_table[i] = static_cast<int32_t>(i);
  int32_t position = 0;
  return GenerateLoop(runner.vocab_size(), prompt, params, eos_token_ids, on_token,
                      [&](std::span<const int32_t> tokens, std::vector<float>* logits) -> absl::Status {
                        // Long prompts run in chunks of max_chunk_tokens (chunked prefill).
                        for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(max_chunk_tokens)) {
                          const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(max_chunk_tokens));
                          ModelBatch batch;
                          SequenceChunk& chunk = batch.chunks.emplace_back();
                          chunk.token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                                 tokens.begin() + static_cast<std::ptrdiff_t>(begin + n));
                          chunk.start_position = position;
                          chunk.block_table = block_table;
                          chunk.compute_logits = begin + n == tokens.size();
                          KVMESH_ASSIGN_OR_RETURN(ModelOutput out, runner.Execute(batch));
                          position += static_cast<int32_t>(n);
                          if (chunk.compute_logits) *logits = std::move(out.logits);
                        }
                        return absl::OkStatus();
                      });
}

}  // namespace kvmesh::engine
