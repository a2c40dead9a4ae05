#include "engine/sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvmesh::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// NaN never wins (-inf); +inf becomes the largest finite float so that
// exp(s - s_max) stays defined.
float SanitizeLogit(float x) {
  if (std::isnan(x)) return kNegInf;
  if (x == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return x;
}

absl::Status FieldError(std::string_view field, std::string_view requirement, const auto& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(absl::string_view(field.data(), field.size()), " must be ",
                   absl::string_view(requirement.data(), requirement.size()), ", got ", value, "."));
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Orders token ids by logit, highest first, lowest id first on ties. Logits must
// hold no NaN (Sample() maps NaN to -inf), so this is a strict weak order.
struct HigherLogit {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

}  // namespace

// ---- SamplingParams ----

absl::Status SamplingParams::Validate(int32_t vocab_size, int32_t max_logprobs) const {
  if (vocab_size <= 0) return FieldError("vocab_size", "positive", vocab_size);
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return FieldError("temperature", "non-negative and finite", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return FieldError("top_p", "in (0, 1]", top_p);
  if (top_k < -1) return FieldError("top_k", "-1 or 0 (disable), or at least 1", top_k);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return FieldError("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return FieldError("repetition_penalty", "greater than zero and finite", repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return FieldError("presence_penalty", "in [-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return FieldError("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }
  if (max_tokens < 1) return FieldError("max_tokens", "at least 1", max_tokens);
  if (min_tokens < 0) return FieldError("min_tokens", "greater than or equal to 0", min_tokens);
  if (min_tokens > max_tokens) {
    return FieldError("min_tokens", absl::StrCat("less than or equal to max_tokens (", max_tokens, ")"), min_tokens);
  }
  if (logprobs < -1) return FieldError("logprobs", "-1 (off) or non-negative", logprobs);
  const int32_t logprobs_limit = std::min(max_logprobs, vocab_size);
  if (logprobs > logprobs_limit) {
    return FieldError("logprobs", absl::StrCat("at most ", logprobs_limit), logprobs);
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError("stop_token_ids", absl::StrCat("within the vocabulary [0, ", vocab_size, ")"), id);
    }
  }
  return absl::OkStatus();
}

// ---- StopChecker ----

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids)
    : stop_token_ids_(params.stop_token_ids.begin(), params.stop_token_ids.end()),
      max_tokens_(params.max_tokens),
      min_tokens_(params.min_tokens) {
  if (!params.ignore_eos) eos_token_ids_.insert(eos_token_ids.begin(), eos_token_ids.end());
}

StopDecision StopChecker::Check(int32_t token_id, int32_t num_output_tokens) const {
  StopDecision decision;
  // 1. Nothing stops before min_tokens (their logits were masked anyway).
  if (num_output_tokens < min_tokens_) return decision;
  // 2. EOS, then stop tokens: "stop" wins over "length" on the last allowed token.
  if (eos_token_ids_.contains(token_id)) {
    decision.reason = FinishReason::kStop;
    return decision;
  }
  if (stop_token_ids_.contains(token_id)) {
    decision.reason = FinishReason::kStop;
    decision.stop_token_id = token_id;
    return decision;
  }
  // 3. Length.
  if (num_output_tokens >= max_tokens_) decision.reason = FinishReason::kLength;
  return decision;
}

// ---- SequenceSampler ----

uint64_t DrawGlobalSeed() {
  static const uint64_t base = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  }();
  static std::atomic<uint64_t> counter{0};
  return SplitMix64(base + counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull);
}

SequenceSampler::SequenceSampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size) {}

absl::StatusOr<SequenceSampler> SequenceSampler::Create(const SamplingParams& params, int32_t vocab_size,
                                                        std::span<const int32_t> prompt_token_ids,
                                                        std::span<const int32_t> eos_token_ids) {
  if (absl::Status s = params.Validate(vocab_size); !s.ok()) return s;
  for (size_t i = 0; i < prompt_token_ids.size(); ++i) {
    if (prompt_token_ids[i] < 0 || prompt_token_ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", prompt_token_ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  SequenceSampler sampler(params, vocab_size);
  sampler.seed_ = params.seed.has_value() ? *params.seed : DrawGlobalSeed();
  sampler.rng_.seed(sampler.seed_);
  if (params.repetition_penalty != 1.0f) {
    sampler.prompt_tokens_.insert(prompt_token_ids.begin(), prompt_token_ids.end());
  }
  if (params.min_tokens > 0) {
    sampler.min_tokens_masked_ = params.stop_token_ids;
    if (!params.ignore_eos) {
      sampler.min_tokens_masked_.insert(sampler.min_tokens_masked_.end(), eos_token_ids.begin(),
                                        eos_token_ids.end());
    }
  }
  sampler.penalized_.resize(static_cast<size_t>(vocab_size));
  return sampler;
}

void SequenceSampler::Append(int32_t token_id) {
  ++num_output_tokens_;
  ++output_counts_[token_id];
}

double SequenceSampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void SequenceSampler::ApplyMasksAndPenalties(std::span<const float> logits) {
  float* l = penalized_.data();
  for (int32_t i = 0; i < vocab_size_; ++i) l[i] = SanitizeLogit(logits[i]);
  const auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab_size_; };

  // 1. min_tokens.
  if (num_output_tokens_ < params_.min_tokens) {
    for (int32_t id : min_tokens_masked_) {
      if (in_vocab(id)) l[id] = kNegInf;
    }
  }
  // 2. Penalties, as vLLM's apply_penalties computes them in f32: repetition
  //    scales by 1/p or p once per distinct token seen in prompt or output, then
  //    frequency subtracts f * count and presence subtracts p for output tokens.
  if (params_.repetition_penalty != 1.0f) {
    const float p = params_.repetition_penalty;
    const float inverse = 1.0f / p;
    auto penalize = [&](int32_t id) {
      if (in_vocab(id)) l[id] = l[id] > 0.0f ? l[id] * inverse : l[id] * p;
    };
    for (int32_t id : prompt_tokens_) penalize(id);
    for (const auto& [id, count] : output_counts_) {
      if (!prompt_tokens_.contains(id)) penalize(id);
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      if (!in_vocab(id)) continue;
      l[id] = l[id] - params_.frequency_penalty * static_cast<float>(count);
      l[id] = l[id] - params_.presence_penalty;
    }
  }
}

bool SequenceSampler::SampleRandom(int32_t* token_id) {
  const float* l = penalized_.data();
  const double inv_temperature = 1.0 / static_cast<double>(params_.temperature);
  const int32_t v = vocab_size_;
  const bool use_top_k = params_.top_k > 0 && params_.top_k < v;
  const bool use_top_p = params_.top_p < 1.0f;
  const HigherLogit higher{l};
  weights_.clear();

  // Survivors end up in order_[0, n) with unnormalised weights exp(s - s_max),
  // s = logit / T; the candidate with the highest logit is always among them.
  int32_t n = 0;
  double s_max = 0;
  if (!use_top_k && !use_top_p) {
    // All tokens survive steps 4-5: no index array, no sort.
    float max_logit = kNegInf;
    for (int32_t i = 0; i < v; ++i) max_logit = std::max(max_logit, l[i]);
    if (max_logit == kNegInf) return false;
    s_max = static_cast<double>(max_logit) * inv_temperature;
    order_.resize(static_cast<size_t>(v));
    for (int32_t i = 0; i < v; ++i) {
      if (l[i] == kNegInf) continue;
      order_[n++] = i;
      weights_.push_back(std::exp(static_cast<double>(l[i]) * inv_temperature - s_max));
    }
  } else {
    order_.resize(static_cast<size_t>(v));
    std::iota(order_.begin(), order_.end(), 0);
    auto begin = order_.begin();
    // 4. top-k: the k highest logits (exactly k, lowest ids on ties), sorted.
    int32_t candidates = v;
    if (use_top_k) {
      candidates = params_.top_k;
      std::nth_element(begin, begin + candidates, order_.end(), higher);
      std::sort(begin, begin + candidates, higher);
    }
    // 5. top-p: keep the most probable tokens while the mass strictly before
    //    them is below top_p (vLLM removes a token once the mass at or below it
    //    is <= 1 - top_p). Without top-k the candidates are sorted lazily in
    //    growing chunks, so only about the nucleus is ever sorted.
    const double head_logit = use_top_k ? l[order_[0]] : *std::max_element(l, l + v);
    if (head_logit == static_cast<double>(kNegInf)) return false;
    s_max = head_logit * inv_temperature;
    const double s_max_local = s_max;
    auto weight_of = [&](int32_t id) { return std::exp(static_cast<double>(l[id]) * inv_temperature - s_max_local); };
    if (!use_top_p) {
      n = candidates;
      for (int32_t i = 0; i < n; ++i) weights_.push_back(weight_of(order_[i]));
    } else {
      double total = 0;
      for (int32_t i = 0; i < candidates; ++i) total += weight_of(order_[i]);
      const double threshold = static_cast<double>(params_.top_p) * total;
      int32_t sorted = use_top_k ? candidates : 0;
      int32_t chunk = 64;
      double mass_before = 0;
      bool done = false;
      while (!done) {
        if (sorted < candidates && n == sorted) {
          const int32_t next = std::min(candidates, sorted + chunk);
          std::nth_element(begin + sorted, begin + next, begin + candidates, higher);
          std::sort(begin + sorted, begin + next, higher);
          sorted = next;
          chunk *= 4;
        }
        for (; n < sorted; ++n) {
          if (!(mass_before < threshold)) {
            done = true;
            break;
          }
          const double w = weight_of(order_[n]);
          weights_.push_back(w);
          mass_before += w;
        }
        if (sorted == candidates) done = true;
      }
    }
  }

  // 6. min-p: drop tokens less likely than min_p x the most likely survivor.
  //    The ratio p_i / p_max = exp(s_i - s_max) does not depend on renormalisation.
  if (params_.min_p > 0.0f) {
    const double min_ratio = static_cast<double>(params_.min_p);
    int32_t kept = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (weights_[i] < min_ratio) continue;
      order_[kept] = order_[i];
      weights_[kept] = weights_[i];
      ++kept;
    }
    n = kept;
    weights_.resize(static_cast<size_t>(n));
  }

  // 7. Inverse CDF over the survivors in their current order.
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += weights_[i];
  if (!(total > 0)) return false;
  const double target = NextUniform() * total;
  double cumulative = 0;
  int32_t last_positive = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (weights_[i] <= 0) continue;
    last_positive = i;
    cumulative += weights_[i];
    if (target < cumulative) {
      *token_id = order_[i];
      return true;
    }
  }
  *token_id = order_[last_positive];  // rounding left target at the very top
  return true;
}

void SequenceSampler::FillRawLogprobs(std::span<const float> logits, SampleResult* result) const {
  // log_softmax in f64 over the raw logits, sanitised as for sampling.
  auto raw = [&](int32_t i) { return static_cast<double>(SanitizeLogit(logits[i])); };
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < vocab_size_; ++i) max_logit = std::max(max_logit, raw(i));
  double sum = 0;
  for (int32_t i = 0; i < vocab_size_; ++i) sum += std::exp(raw(i) - max_logit);
  const double log_normalizer = max_logit + std::log(sum);
  const double chosen = raw(result->token_id);
  result->logprob = static_cast<float>(chosen - log_normalizer);
  if (params_.logprobs < 0) return;

  int32_t higher = 0;
  for (int32_t i = 0; i < vocab_size_; ++i) higher += raw(i) > chosen ? 1 : 0;
  result->rank = higher + 1;
  const int32_t top_n = std::min(params_.logprobs, vocab_size_);
  if (top_n == 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(vocab_size_));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return raw(a) > raw(b) || (raw(a) == raw(b) && a < b); };
  std::nth_element(ids.begin(), ids.begin() + (top_n - 1), ids.end(), better);
  std::sort(ids.begin(), ids.begin() + top_n, better);
  result->top_logprobs.reserve(static_cast<size_t>(top_n));
  for (int32_t i = 0; i < top_n; ++i) {
    result->top_logprobs.push_back({ids[i], static_cast<float>(raw(ids[i]) - log_normalizer)});
  }
}

absl::StatusOr<SampleResult> SequenceSampler::Sample(std::span<const float> logits) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries, the vocabulary ", vocab_size_));
  }
  ApplyMasksAndPenalties(logits);
  SampleResult result;
  bool found = false;
  if (params_.is_greedy()) {
    // Strictly greater: the lowest id wins ties.
    float best = kNegInf;
    for (int32_t i = 0; i < vocab_size_; ++i) {
      if (penalized_[i] > best) {
        best = penalized_[i];
        result.token_id = i;
        found = true;
      }
    }
  } else {
    found = SampleRandom(&result.token_id);
  }
  if (!found) {
    return absl::InvalidArgumentError("no token has a finite logit after masking and penalties");
  }
  FillRawLogprobs(logits, &result);
  return result;
}

}  // namespace kvmesh::engine
