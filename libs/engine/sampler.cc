#include "engine/sampler.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/greedy_argmax.h"

namespace kvmesh::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();


// e^x for x <= 0 in f32, and exactly 0 below -87 (so -inf gives 0): Cephes'
// expf (range reduction by ln 2, degree-6 polynomial; error ~1 ulp) on four
// lanes with GCC/Clang vector extensions. No libm and no branches: the loops
// run SIMD on every target, and every platform gets the same bits, which keeps
// seeded draws identical across libms.
using F32x4 = float __attribute__((vector_size(16)));
using I32x4 = int32_t __attribute__((vector_size(16)));

inline F32x4 ExpNonPositive(F32x4 x) {
  const I32x4 underflow = x < -87.0f;
  x = underflow ? F32x4{} - 87.0f : x;
  // n = round(x / ln 2) via the 1.5 * 2^23 trick; the sum's low bits hold n.
  constexpr float kShifter = 12582912.0f;
  const F32x4 shifted = x * 1.44269504088896341f + kShifter;
  const F32x4 n = shifted - kShifter;
  const F32x4 r = x - n * 0.693359375f - n * -2.12194440e-4f;
  const F32x4 z = r * r;
  F32x4 y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const I32x4 n_int = std::bit_cast<I32x4>(shifted) - std::bit_cast<int32_t>(kShifter);
  const I32x4 scale_bits = (n_int + 127) << 23;  // n >= -126: a normal power of two
  const F32x4 result = y * std::bit_cast<F32x4>(scale_bits);
  return underflow ? F32x4{} : result;
}

// out[i] = e^((in[i] - shift) * scale) for in[i] <= shift; -inf gives 0.
void ExpShifted(const float* in, float shift, float scale, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    F32x4 x;
    std::memcpy(&x, in + i, sizeof(x));
    const F32x4 e = ExpNonPositive((x - shift) * scale);
    std::memcpy(out + i, &e, sizeof(e));
  }
  if (i < n) {
    // The tail through the same four-lane code, padded with -inf.
    F32x4 x = F32x4{} - std::numeric_limits<float>::infinity();
    std::memcpy(&x, in + i, static_cast<size_t>(n - i) * sizeof(float));
    const F32x4 e = ExpNonPositive((x - shift) * scale);
    std::memcpy(out + i, &e, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// Sum in f64 with 8 interleaved partial sums: a fixed order (deterministic)
// that is not bound by one add's latency.
double SumF64(const float* w, int64_t n) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t whole = n - n % 8;
  for (int64_t i = 0; i < whole; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += static_cast<double>(w[i + j]);
  }
  for (int64_t i = whole; i < n; ++i) partial[0] += static_cast<double>(w[i]);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

// The first index whose inclusive prefix sum of `w` exceeds `target` (block sums
// first, then one block token by token); the last positive index when rounding
// leaves target at the very top. Requires some w > 0.
int64_t InverseCdf(const float* w, int64_t n, double target) {
  constexpr int64_t kBlock = 256;
  double cumulative = 0;
  int64_t begin = 0;
  for (; begin + kBlock < n; begin += kBlock) {
    const double block = SumF64(w + begin, kBlock);
    if (target < cumulative + block) break;
    cumulative += block;
  }
  for (int64_t i = begin; i < n; ++i) {
    if (!(w[i] > 0)) continue;
    cumulative += static_cast<double>(w[i]);
    if (target < cumulative) return i;
  }
  for (int64_t i = n - 1; i > 0; --i) {
    if (w[i] > 0) return i;
  }
  return 0;
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
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return FieldError("logit_bias", absl::StrCat("keyed by token ids within the vocabulary [0, ", vocab_size, ")"),
                        id);
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) return FieldError("logit_bias", "values in [-100, 100]", bias);
  }
  if (prompt_logprobs < -1) return FieldError("prompt_logprobs", "-1 (off) or non-negative", prompt_logprobs);
  if (prompt_logprobs > logprobs_limit) {
    return FieldError("prompt_logprobs", absl::StrCat("at most ", logprobs_limit), prompt_logprobs);
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
  sampler.probs_.resize(static_cast<size_t>(vocab_size));
  return sampler;
}

void SequenceSampler::Append(int32_t token_id) {
  ++num_output_tokens_;
  ++output_counts_[token_id];
}

void SequenceSampler::Resume(std::span<const int32_t> output_token_ids) {
  for (const int32_t token : output_token_ids) {
    Append(token);
    if (!params_.is_greedy()) (void)NextUniform();
  }
}

double SequenceSampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}


bool SequenceSampler::MasksOrPenaltiesApply() const {
  return (num_output_tokens_ < params_.min_tokens && !min_tokens_masked_.empty()) || !params_.logit_bias.empty() ||
         params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
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
  // 1b. logit_bias (OpenAI: -100 should ban the token; make it exact).
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) l[id] = bias <= -100.0f ? kNegInf : l[id] + bias;
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
  const float inv_temperature = 1.0f / params_.temperature;
  const int32_t v = vocab_size_;
  const bool use_top_k = params_.top_k > 0 && params_.top_k < v;
  const bool use_top_p = params_.top_p < 1.0f;
  const bool use_min_p = params_.min_p > 0.0f;
  const HigherLogit higher{l};
  float* w = probs_.data();  // w[id] = exp((logit - max logit) / T): unnormalised softmax(logits / T)

  // 4. top-k: the k highest logits (exactly k, lowest ids on ties), sorted;
  //    O(V) selection plus O(k log k). Otherwise every token is a candidate.
  int32_t n = 0;
  double all_total = 0;  // sum of w over the vocabulary, when computed
  if (use_top_k) {
    order_.resize(static_cast<size_t>(v));
    std::iota(order_.begin(), order_.end(), 0);
    n = params_.top_k;
    std::nth_element(order_.begin(), order_.begin() + n, order_.end(), higher);
    std::sort(order_.begin(), order_.begin() + n, higher);
    const float max_logit = l[order_[0]];
    if (max_logit == kNegInf) return false;
    weights_.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) weights_[i] = l[order_[i]];
    ExpShifted(weights_.data(), max_logit, inv_temperature, weights_.data(), n);
    for (int32_t i = 0; i < n; ++i) w[order_[i]] = weights_[i];
  } else {
    float max_logit = kNegInf;
    for (int32_t i = 0; i < v; ++i) max_logit = l[i] > max_logit ? l[i] : max_logit;
    if (max_logit == kNegInf) return false;
    ExpShifted(l, max_logit, inv_temperature, w, v);
    if (!use_top_p && !use_min_p) {
      // 7 (no filters): draw over the whole vocabulary in id order.
      const double total = SumF64(w, v);
      if (!(total > 0)) return false;
      *token_id = static_cast<int32_t>(InverseCdf(w, v, NextUniform() * total));
      return true;
    }
    order_.resize(static_cast<size_t>(v));
    if (use_top_p) {
      // Drop tokens of probability <= (1 - top_p) / V first. Together they hold
      // at most 1 - top_p and each is below every other token, so top-p drops
      // them all anyway; the nucleus sort then sees far fewer tokens.
      all_total = SumF64(w, v);
      const double floor = (1.0 - static_cast<double>(params_.top_p)) * all_total / static_cast<double>(v);
      for (int32_t i = 0; i < v; ++i) {
        if (static_cast<double>(w[i]) > floor) order_[n++] = i;
      }
    } else {
      for (int32_t i = 0; i < v; ++i) {
        if (w[i] > 0.0f) order_[n++] = i;
      }
    }
  }

  // 5. top-p: walking from the most probable token, keep a token while the mass
  //    strictly before it is below top_p (vLLM drops a token once the mass at or
  //    below it is <= 1 - top_p). Without top-k the candidates are sorted lazily
  //    in growing chunks, so only about the nucleus is ever sorted.
  if (use_top_p) {
    double total = 0;
    if (use_top_k) {
      for (int32_t i = 0; i < n; ++i) total += static_cast<double>(w[order_[i]]);
    } else {
      total = all_total;
    }
    const double threshold = static_cast<double>(params_.top_p) * total;
    auto begin = order_.begin();
    int32_t sorted = use_top_k ? n : 0;
    int32_t chunk = 64;
    int32_t nucleus = 0;
    double mass_before = 0;
    while (nucleus < n && mass_before < threshold) {
      if (nucleus == sorted) {
        const int32_t next = std::min(n, sorted + chunk);
        std::nth_element(begin + sorted, begin + next, begin + n, higher);
        std::sort(begin + sorted, begin + next, higher);
        sorted = next;
        chunk *= 4;
      }
      for (; nucleus < sorted && mass_before < threshold; ++nucleus) {
        mass_before += static_cast<double>(w[order_[nucleus]]);
      }
    }
    n = nucleus;
  }

  // 6. min-p: drop tokens less likely than min_p x the most likely survivor,
  //    whose weight is 1: p_i / p_max = w_i does not depend on renormalisation.
  if (use_min_p) {
    int32_t kept = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (w[order_[i]] >= params_.min_p) order_[kept++] = order_[i];
    }
    n = kept;
  }

  // 7. Inverse CDF over the survivors in their current order.
  weights_.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) weights_[i] = w[order_[i]];
  const double total = SumF64(weights_.data(), n);
  if (!(total > 0)) return false;
  *token_id = order_[InverseCdf(weights_.data(), n, NextUniform() * total)];
  return true;
}

namespace {

// FillRawLogprobs' work over caller-owned scratch ([V] floats each, order [V] ints).
void RawLogprobsInto(std::span<const float> logits, int32_t top_n, std::vector<float>& raw_buf,
                     std::vector<float>& exp_buf, std::vector<int32_t>& order, SampleResult* result) {
  // log_softmax of the raw logits (sanitised as for sampling): exps in f32,
  // sums and logs in f64.
  const int32_t v = static_cast<int32_t>(logits.size());
  raw_buf.resize(static_cast<size_t>(v));
  exp_buf.resize(static_cast<size_t>(v));
  float* raw = raw_buf.data();
  float max_logit = kNegInf;
  for (int32_t i = 0; i < v; ++i) {
    raw[i] = SanitizeLogit(logits[i]);
    max_logit = raw[i] > max_logit ? raw[i] : max_logit;
  }
  float* w = exp_buf.data();
  ExpShifted(raw, max_logit, 1.0f, w, v);
  const double log_normalizer = static_cast<double>(max_logit) + std::log(SumF64(w, v));
  const float chosen = raw[result->token_id];
  result->logprob = static_cast<float>(static_cast<double>(chosen) - log_normalizer);
  int32_t higher = 0;
  for (int32_t i = 0; i < v; ++i) higher += raw[i] > chosen ? 1 : 0;
  result->rank = higher + 1;

  top_n = std::min(top_n, v);
  if (top_n <= 0) return;
  order.resize(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  const HigherLogit better{raw};
  std::nth_element(order.begin(), order.begin() + (top_n - 1), order.end(), better);
  std::sort(order.begin(), order.begin() + top_n, better);
  result->top_logprobs.reserve(static_cast<size_t>(top_n));
  for (int32_t i = 0; i < top_n; ++i) {
    const int32_t id = order[i];
    result->top_logprobs.push_back({id, static_cast<float>(static_cast<double>(raw[id]) - log_normalizer)});
  }
}

}  // namespace

void SequenceSampler::FillRawLogprobs(std::span<const float> logits, SampleResult* result) {
  // Sampling is done: penalized_ and probs_ are free scratch.
  RawLogprobsInto(logits, params_.logprobs, penalized_, probs_, order_, result);
}

SampleResult ComputeRawLogprobs(std::span<const float> logits, int32_t token_id, int32_t top_n) {
  SampleResult result;
  result.token_id = token_id;
  std::vector<float> raw, exps;
  std::vector<int32_t> order;
  RawLogprobsInto(logits, top_n, raw, exps, order, &result);
  return result;
}

absl::StatusOr<SampleResult> SequenceSampler::Sample(std::span<const float> logits) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries, the vocabulary ", vocab_size_));
  }
  SampleResult result;
  bool found = false;
  if (params_.is_greedy()) {
    // Without masks or penalties the logits need no penalized copy: sanitized on the fly.
    const bool plain = !MasksOrPenaltiesApply();
    if (!plain) ApplyMasksAndPenalties(logits);
    const int32_t best = plain ? GreedyToken(logits.data(), vocab_size_)
                               : GreedyArgmax(penalized_.data(), vocab_size_, [](float x) { return x; });
    if (best >= 0) {
      result.token_id = best;
      found = true;
    }
  } else {
    ApplyMasksAndPenalties(logits);
    found = SampleRandom(&result.token_id);
  }
  if (!found) {
    return absl::InvalidArgumentError("no token has a finite logit after masking and penalties");
  }
  if (params_.logprobs >= 0) FillRawLogprobs(logits, &result);
  return result;
}

}  // namespace kvmesh::engine
