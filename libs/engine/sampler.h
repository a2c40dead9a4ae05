// Token sampling with vLLM's request semantics.
//
// SamplingParams is what a request asks for (OpenAI/vLLM fields). A
// SequenceSampler is created per sequence: it owns the sequence's RNG (seeded
// from `seed`, or from a process-wide source when unseeded) and the token counts
// its penalties need. Each step the engine calls Sample() with the model's
// logits row, then Append() with the token it keeps, then asks a StopChecker
// whether the sequence is finished.
//
// Sample() processes, in order (vLLM v0's order):
//   1. min_tokens: EOS and stop tokens are masked until min_tokens outputs exist;
//      then logit_bias is added (OpenAI's: a bias of -100 or less bans the token);
//   2. penalties: repetition (over prompt + output tokens: logit > 0 ? logit / p
//      : logit * p), then frequency (- f * count) and presence (- p * [count > 0])
//      over output tokens only;
//   3. temperature: below kGreedyTemperature the result is the argmax of the
//      penalized logits (lowest id on ties) and steps 4-6 are skipped;
//   4. top-k, 5. top-p, 6. min-p (relative to the most probable token), then
//   7. one draw from the renormalised survivors.
// Logprobs (when requested) are vLLM v1's default "raw" logprobs: log_softmax of
// the unprocessed model logits, computed in f64.
//
// Reproducibility: a seeded sampler draws the same tokens for the same logits on
// every run and platform: std::mt19937_64's output is fixed by the standard,
// uniforms are built from its raw bits here (std distributions are not
// portable), and the softmax uses kvmesh's own exp, not libm's. Cost per Sample(): one exp per token, O(V) selection plus
// O(k log k) for top-k, or about O(V + m log m) for top-p where m is the size of
// the nucleus; never a full-vocabulary sort.
//
// Thread-safety: SamplingParams and StopChecker are immutable values; a
// SequenceSampler is not thread-safe and belongs to the sequence's owner.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvmesh::engine {

// Temperatures below this mean greedy decoding (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;
// vLLM's default --max-logprobs.
inline constexpr int32_t kDefaultMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;  // 0 => greedy
  int32_t top_k = -1;        // -1 or 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  std::optional<uint64_t> seed;  // unset: a seed is drawn from a process-wide source
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  int32_t logprobs = -1;            // -1: off; 0: the chosen token only; N: also the top N
  std::vector<int32_t> stop_token_ids;  // finish with "stop" (besides EOS)
  bool ignore_eos = false;
  int32_t max_tokens = 16;  // >= 1
  int32_t min_tokens = 0;   // EOS and stop tokens are suppressed until this many outputs
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the raw logit before
  // sampling; -100 bans the token outright. Logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's prompt_logprobs: -1 off; N >= 0: the logprob of every prompt token after the
  // first given the tokens before it (and the top N alternatives). The engine then
  // computes the LM head at every prompt position and does not take the prompt from the
  // prefix cache (a cached block has no logits).
  int32_t prompt_logprobs = -1;

  bool is_greedy() const { return temperature < kGreedyTemperature; }

  // InvalidArgument naming the field for an out-of-range value, as vLLM checks:
  // temperature >= 0, top_p in (0, 1], top_k == -1/0 or >= 1, min_p in [0, 1],
  // penalties in range, max_tokens >= 1, 0 <= min_tokens <= max_tokens,
  // -1 <= logprobs <= min(max_logprobs, vocab_size), stop ids within the vocabulary.
  absl::Status Validate(int32_t vocab_size, int32_t max_logprobs = kDefaultMaxLogprobs) const;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  bool operator==(const TokenLogprob&) const = default;
};

struct SampleResult {
  int32_t token_id = 0;
  // log_softmax(raw logits)[token_id]; set only when logprobs >= 0 (it costs a
  // pass over the vocabulary, as in vLLM).
  std::optional<float> logprob;
  // 1 + the number of tokens with a higher raw logit (vLLM's rank); 0 when logprobs is off.
  int32_t rank = 0;
  // The `logprobs` most likely tokens under the raw logits, most likely first
  // (lowest id first on ties). Empty unless logprobs >= 1.
  std::vector<TokenLogprob> top_logprobs;
};

enum class FinishReason : uint8_t { kNone, kStop, kLength };

// "stop", "length", or "" for kNone (OpenAI's finish_reason).
std::string_view FinishReasonName(FinishReason reason);

struct StopDecision {
  FinishReason reason = FinishReason::kNone;
  // The stop_token_ids entry that finished the sequence (vLLM's stop_reason);
  // unset for EOS, length, or not finished.
  std::optional<int32_t> stop_token_id;
  bool finished() const { return reason != FinishReason::kNone; }
};

// Decides whether the newest output token finishes a sequence, in vLLM's order:
// nothing stops before min_tokens outputs; then EOS (unless ignore_eos) and
// stop_token_ids give "stop"; then reaching max_tokens gives "length".
class StopChecker {
 public:
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids);

  // `num_output_tokens` includes `token_id`.
  StopDecision Check(int32_t token_id, int32_t num_output_tokens) const;

 private:
  absl::flat_hash_set<int32_t> eos_token_ids_;  // empty when ignore_eos
  absl::flat_hash_set<int32_t> stop_token_ids_;
  int32_t max_tokens_;
  int32_t min_tokens_;
};

class SequenceSampler {
 public:
  // Validates `params` (as SamplingParams::Validate) and the prompt's token ids.
  // `eos_token_ids` are masked while fewer than min_tokens outputs exist.
  static absl::StatusOr<SequenceSampler> Create(const SamplingParams& params, int32_t vocab_size,
                                                std::span<const int32_t> prompt_token_ids,
                                                std::span<const int32_t> eos_token_ids);

  SequenceSampler(SequenceSampler&&) = default;
  SequenceSampler& operator=(SequenceSampler&&) = default;

  // Picks the next token from one row of model logits [vocab_size]. Does not
  // record it: call Append() with the token the sequence keeps. NaN logits count
  // as -inf, +inf as the largest finite float. InvalidArgument if
  // logits.size() != vocab_size or every logit is -inf after masking.
  absl::StatusOr<SampleResult> Sample(std::span<const float> logits);

  // Records an output token for the penalties and min_tokens. Ids outside the
  // vocabulary are counted but never match a logit.
  void Append(int32_t token_id);

  // Continues a sequence another sampler started (a migrated request): Appends each of
  // `output_token_ids` and, unless greedy, advances the RNG by one draw per token (a
  // non-greedy Sample() makes exactly one), so a seeded sampler draws next what the
  // first one would have.
  void Resume(std::span<const int32_t> output_token_ids);

  const SamplingParams& params() const { return params_; }
  // The seed in use (drawn when the request gave none), for logs and replays.
  uint64_t seed() const { return seed_; }
  int32_t num_output_tokens() const { return num_output_tokens_; }

 private:
  SequenceSampler(const SamplingParams& params, int32_t vocab_size);

  // Steps 1-2 into penalized_.
  void ApplyMasksAndPenalties(std::span<const float> logits);
  // Whether ApplyMasksAndPenalties would change any logit beyond sanitizing it.
  bool MasksOrPenaltiesApply() const;
  // Steps 4-7 over penalized_; false if nothing can be drawn.
  bool SampleRandom(int32_t* token_id);
  // Overwrites the scratch buffers.
  void FillRawLogprobs(std::span<const float> logits, SampleResult* result);
  // A uniform double in [0, 1) from the top 53 bits of one RNG output.
  double NextUniform();

  SamplingParams params_;
  int32_t vocab_size_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  int32_t num_output_tokens_ = 0;
  absl::flat_hash_set<int32_t> prompt_tokens_;  // filled only when repetition_penalty != 1
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> min_tokens_masked_;  // EOS + stop ids (unless ignore_eos drops EOS)
  // Scratch reused across steps.
  std::vector<float> penalized_;  // [V] logits after steps 1-2
  std::vector<float> probs_;      // [V] exp((logit - max) / T)
  std::vector<int32_t> order_;    // candidate token ids
  std::vector<float> weights_;    // survivors' weights, in order_'s order
};

// log_softmax(raw logits)[token_id] with the rank and the `top_n` most likely tokens,
// exactly as a sample's logprobs are computed (the prompt logprobs use it).
// `logits` must be non-empty and token_id inside it.
SampleResult ComputeRawLogprobs(std::span<const float> logits, int32_t token_id, int32_t top_n);

// A fresh seed from the process-wide source unseeded samplers use: random_device
// mixed with a counter, so concurrent requests get distinct streams. Thread-safe.
uint64_t DrawGlobalSeed();

}  // namespace kvmesh::engine
