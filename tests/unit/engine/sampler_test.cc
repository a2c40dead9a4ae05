#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvmesh::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SequenceSampler MakeSampler(const SamplingParams& params, int32_t vocab_size, std::vector<int32_t> prompt = {},
                            std::vector<int32_t> eos = {}) {
  auto sampler = SequenceSampler::Create(params, vocab_size, prompt, eos);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

int32_t SampleId(SequenceSampler& sampler, const std::vector<float>& logits) {
  auto result = sampler.Sample(logits);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->token_id;
}

// Counts of `draws` samples (not appended: the distribution stays fixed).
std::map<int32_t, int> Histogram(const SamplingParams& params, const std::vector<float>& logits, int draws) {
  SequenceSampler sampler = MakeSampler(params, static_cast<int32_t>(logits.size()));
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[SampleId(sampler, logits)];
  return counts;
}

std::set<int32_t> Support(const std::map<int32_t, int>& histogram) {
  std::set<int32_t> ids;
  for (const auto& [id, count] : histogram) ids.insert(id);
  return ids;
}

std::vector<float> RandomLogits(int32_t n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::vector<float> logits(static_cast<size_t>(n));
  // Not std::normal_distribution: only needs to be varied, so build from raw bits.
  for (float& l : logits) l = scale * (static_cast<float>(rng() >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  return logits;
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

// Logits whose softmax is exactly proportional to `probs` (at T = 1).
std::vector<float> LogitsFor(std::vector<double> probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// ---- reproducibility ----

TEST(SequenceSamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> logits = RandomLogits(1000, 7, 1.0f);
  SamplingParams params{.temperature = 0.9f, .top_p = 0.95f, .seed = 1234};
  SequenceSampler a = MakeSampler(params, 1000);
  SequenceSampler b = MakeSampler(params, 1000);
  params.seed = 1235;
  SequenceSampler c = MakeSampler(params, 1000);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(SampleId(a, logits));
    tb.push_back(SampleId(b, logits));
    tc.push_back(SampleId(c, logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  EXPECT_EQ(a.seed(), 1234u);
}

TEST(SequenceSamplerTest, SeededDrawsAreFixedAcrossRunsAndPlatforms) {
  // std::mt19937_64 is specified exactly by the standard ([rand.predef]: the
  // 10000th output of a default-constructed engine is 9981545732273789042), and
  // the sampler derives its uniforms from raw bits, so these tokens are fixed.
  std::mt19937_64 engine;
  engine.discard(9999);
  EXPECT_EQ(engine(), 9981545732273789042ull);

  const std::vector<float> logits = LogitsFor({0.1, 0.2, 0.3, 0.4});
  SequenceSampler sampler = MakeSampler({.seed = 42}, 4);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back(SampleId(sampler, logits));
  EXPECT_THAT(tokens, ElementsAre(3, 3, 3, 1, 3, 0, 2, 2, 1, 2, 0, 2));
}

TEST(SequenceSamplerTest, UnseededSamplersDrawDistinctSeeds) {
  SequenceSampler a = MakeSampler({}, 10);
  SequenceSampler b = MakeSampler({}, 10);
  EXPECT_NE(a.seed(), b.seed());
}

// ---- greedy and top-k ----

TEST(SequenceSamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = RandomLogits(5000, seed);
    SequenceSampler sampler = MakeSampler({.temperature = 0.0f, .seed = seed}, 5000);
    const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(SampleId(sampler, logits), argmax);
  }
  SequenceSampler sampler = MakeSampler({.temperature = 0.0f}, 6);
  EXPECT_EQ(SampleId(sampler, {1.0f, 4.0f, 2.0f, 4.0f, 4.0f, -1.0f}), 1);
  // Tiny temperatures are greedy too (vLLM's epsilon).
  SequenceSampler tiny = MakeSampler({.temperature = 1e-6f}, 3);
  EXPECT_EQ(SampleId(tiny, {0.0f, 0.1f, 0.05f}), 1);
}

TEST(SequenceSamplerTest, GreedyTiesNanAndInfinityAcrossVectorLanes) {
  const float inf = std::numeric_limits<float>::infinity();
  const float top = std::numeric_limits<float>::max();
  for (int32_t vocab : {1, 15, 16, 17, 100, 4099}) {
    for (int32_t first : {0, vocab / 3, vocab - 1}) {
      std::vector<float> logits(static_cast<size_t>(vocab), -5.0f);
      for (int32_t i = 0; i < vocab; i += 7) logits[static_cast<size_t>(i)] = NAN;
      // The winner and a later tie; +inf sanitizes to the largest float, so they tie too.
      logits[static_cast<size_t>(first)] = top;
      if (first + 5 < vocab) logits[static_cast<size_t>(first + 5)] = inf;
      if (first + 20 < vocab) logits[static_cast<size_t>(first + 20)] = top;
      SequenceSampler plain = MakeSampler({.temperature = 0.0f}, vocab);
      EXPECT_EQ(SampleId(plain, logits), first) << vocab;
      // The same through the penalized copy (a penalty on a token that is not a winner).
      SequenceSampler penalized = MakeSampler({.temperature = 0.0f, .presence_penalty = 0.5f}, vocab);
      EXPECT_EQ(SampleId(penalized, logits), first) << vocab;
    }
  }
}

TEST(SequenceSamplerTest, TopKOneEqualsGreedy) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    // Quantised logits: many ties, as with bf16 logits.
    std::vector<float> logits = RandomLogits(2048, seed);
    for (float& l : logits) l = std::round(l * 4.0f) / 4.0f;
    SequenceSampler greedy = MakeSampler({.temperature = 0.0f}, 2048);
    SequenceSampler top1 = MakeSampler({.temperature = 1.3f, .top_k = 1, .seed = seed}, 2048);
    EXPECT_EQ(SampleId(top1, logits), SampleId(greedy, logits)) << "seed " << seed;
  }
}

TEST(SequenceSamplerTest, TopKRestrictsSupportExactly) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f, 1.8f, 0.0f, 1.7f};
  const auto histogram = Histogram({.top_k = 3, .seed = 1}, logits, 3000);
  EXPECT_EQ(Support(histogram), (std::set<int32_t>{1, 3, 4}));
  // Ties at the k-th logit: exactly k survive, lowest ids first.
  EXPECT_EQ(Support(Histogram({.top_k = 2, .seed = 2}, {5.0f, 3.0f, 3.0f, 3.0f, 1.0f}, 3000)),
            (std::set<int32_t>{0, 1}));
  // top_k >= vocab is off.
  EXPECT_EQ(Support(Histogram({.top_k = 7, .seed = 3}, logits, 5000)).size(), 7u);
}

// ---- top-p and min-p boundaries ----

// Probabilities 1/2, 1/4, 1/8, 1/16, 1/16: cumulative mass before each is 0, .5, .75, .875, .9375.
const std::vector<float> kHalving = LogitsFor({0.5, 0.25, 0.125, 0.0625, 0.0625});

TEST(SequenceSamplerTest, TopPKeepsTokensWhileMassBeforeIsBelowTopP) {
  EXPECT_EQ(Support(Histogram({.top_p = 0.01f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.499f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.501f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.749f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.751f, .seed = 1}, kHalving, 4000)), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.874f, .seed = 1}, kHalving, 4000)), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Histogram({.top_p = 0.876f, .seed = 1}, kHalving, 8000)), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Support(Histogram({.top_p = 1.0f, .seed = 1}, kHalving, 8000)), (std::set<int32_t>{0, 1, 2, 3, 4}));
}

TEST(SequenceSamplerTest, TopPAppliesAfterTemperature) {
  // At T = 0.5 the probabilities become 16:4:1:... / 21.x: token 0 alone has ~0.75.
  EXPECT_EQ(Support(Histogram({.temperature = 0.5f, .top_p = 0.7f, .seed = 1}, kHalving, 2000)),
            (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Histogram({.temperature = 0.5f, .top_p = 0.8f, .seed = 1}, kHalving, 4000)),
            (std::set<int32_t>{0, 1}));
}

TEST(SequenceSamplerTest, MinPKeepsTokensAtLeastMinPTimesTheMostLikely) {
  // Ratios to the most likely: 1, 1/2, 1/4, 1/8, 1/8.
  EXPECT_EQ(Support(Histogram({.min_p = 1.0f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Histogram({.min_p = 0.501f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Histogram({.min_p = 0.499f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Histogram({.min_p = 0.251f, .seed = 1}, kHalving, 2000)), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Histogram({.min_p = 0.249f, .seed = 1}, kHalving, 4000)), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Histogram({.min_p = 0.124f, .seed = 1}, kHalving, 8000)), (std::set<int32_t>{0, 1, 2, 3, 4}));
}

// Reference support by brute force: full sort, then top-k, top-p, min-p.
std::set<int32_t> ReferenceSupport(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.top_k > 0 && p.top_k < static_cast<int32_t>(ids.size())) ids.resize(static_cast<size_t>(p.top_k));
  std::vector<double> w;
  for (int32_t id : ids) w.push_back(std::exp((logits[id] - logits[ids[0]]) / static_cast<double>(p.temperature)));
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::set<int32_t> support;
  double before = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!(before < p.top_p * total)) break;
    before += w[i];
    if (w[i] >= p.min_p) support.insert(ids[i]);
  }
  return support;
}

TEST(SequenceSamplerTest, LargeVocabularyFiltersMatchBruteForce) {
  const int32_t vocab = 128256;
  const std::vector<float> logits = RandomLogits(vocab, 99, 12.0f);
  const std::vector<SamplingParams> cases = {
      {.temperature = 0.8f, .top_p = 0.9f, .seed = 1},
      {.temperature = 1.0f, .top_k = 50, .seed = 2},
      {.temperature = 0.7f, .top_k = 40, .top_p = 0.8f, .seed = 3},
      {.temperature = 1.2f, .top_p = 0.95f, .min_p = 0.05f, .seed = 4},
      {.temperature = 1.0f, .min_p = 0.1f, .seed = 5},
  };
  for (const SamplingParams& params : cases) {
    const std::set<int32_t> reference = ReferenceSupport(logits, params);
    ASSERT_FALSE(reference.empty());
    SequenceSampler sampler = MakeSampler(params, vocab);
    for (int i = 0; i < 100; ++i) {
      const int32_t token = SampleId(sampler, logits);
      EXPECT_TRUE(reference.contains(token)) << "token " << token << " outside the support (size "
                                             << reference.size() << ") for seed " << *params.seed;
    }
  }
}

// ---- distribution ----

TEST(SequenceSamplerTest, EmpiricalDistributionMatchesSoftmaxOverTemperature) {
  // 20000 seeded draws; the largest standard error is sqrt(.25 / 20000) = 0.0035,
  // so a 0.015 absolute tolerance is over 4 standard errors.
  constexpr int kDraws = 20000;
  constexpr double kTolerance = 0.015;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    std::vector<float> scaled;
    for (float l : logits) scaled.push_back(l / temperature);
    const std::vector<double> expected = LogSoftmax(scaled);
    const auto histogram = Histogram({.temperature = temperature, .seed = 2024}, logits, kDraws);
    for (size_t i = 0; i < logits.size(); ++i) {
      const auto it = histogram.find(static_cast<int32_t>(i));
      const double observed = it == histogram.end() ? 0.0 : static_cast<double>(it->second) / kDraws;
      EXPECT_NEAR(observed, std::exp(expected[i]), kTolerance) << "token " << i << " T=" << temperature;
    }
  }
}

TEST(SequenceSamplerTest, EmpiricalDistributionAfterTopKIsRenormalised) {
  constexpr int kDraws = 20000;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
  const auto histogram = Histogram({.temperature = 1.0f, .top_k = 3, .seed = 77}, logits, kDraws);
  const std::vector<double> expected = LogSoftmax({1.0f, 2.0f, 1.5f});  // ids 0, 1, 4
  EXPECT_EQ(Support(histogram), (std::set<int32_t>{0, 1, 4}));
  EXPECT_NEAR(histogram.at(0) / double{kDraws}, std::exp(expected[0]), 0.015);
  EXPECT_NEAR(histogram.at(1) / double{kDraws}, std::exp(expected[1]), 0.015);
  EXPECT_NEAR(histogram.at(4) / double{kDraws}, std::exp(expected[2]), 0.015);
}

// ---- penalties (observed through greedy decisions on each side of the boundary) ----

int32_t GreedyWith(SamplingParams params, const std::vector<float>& logits, std::vector<int32_t> prompt,
                   std::vector<int32_t> outputs) {
  params.temperature = 0.0f;
  SequenceSampler sampler = MakeSampler(params, static_cast<int32_t>(logits.size()), prompt);
  for (int32_t t : outputs) sampler.Append(t);
  return SampleId(sampler, logits);
}

TEST(SequenceSamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  const SamplingParams rep{.repetition_penalty = 2.0f};
  // Token 0 seen in the prompt: 2.0 -> 1.0.
  EXPECT_EQ(GreedyWith(rep, {2.0f, 1.1f}, {0}, {}), 1);
  EXPECT_EQ(GreedyWith(rep, {2.0f, 0.9f}, {0}, {}), 0);
  // Negative: -1.0 -> -2.0.
  EXPECT_EQ(GreedyWith(rep, {-1.0f, -1.5f}, {0}, {}), 1);
  EXPECT_EQ(GreedyWith(rep, {-1.0f, -2.5f}, {0}, {}), 0);
  // Output tokens count too, and a token is penalised once however often it repeats.
  EXPECT_EQ(GreedyWith(rep, {2.0f, 1.1f}, {}, {0}), 1);
  EXPECT_EQ(GreedyWith(rep, {2.0f, 0.9f}, {0}, {0, 0, 0}), 0);
  // Penalties below 1 encourage repetition.
  EXPECT_EQ(GreedyWith({.repetition_penalty = 0.5f}, {2.0f, 3.5f}, {0}, {}), 0);
}

TEST(SequenceSamplerTest, FrequencyAndPresencePenaltiesUseOutputTokensOnly) {
  // frequency 0.5 x 3 occurrences: 2.0 -> 0.5.
  const SamplingParams freq{.frequency_penalty = 0.5f};
  EXPECT_EQ(GreedyWith(freq, {2.0f, 0.4f}, {}, {0, 0, 0}), 0);
  EXPECT_EQ(GreedyWith(freq, {2.0f, 0.6f}, {}, {0, 0, 0}), 1);
  // presence 0.5 once however many occurrences: 2.0 -> 1.5.
  const SamplingParams presence{.presence_penalty = 0.5f};
  EXPECT_EQ(GreedyWith(presence, {2.0f, 1.4f}, {}, {0, 0, 0}), 0);
  EXPECT_EQ(GreedyWith(presence, {2.0f, 1.6f}, {}, {0, 0, 0}), 1);
  // Prompt tokens are not penalised by either.
  EXPECT_EQ(GreedyWith({.presence_penalty = 2.0f, .frequency_penalty = 2.0f}, {2.0f, 1.9f}, {0, 0, 0}, {}), 0);
  // Negative penalties encourage.
  EXPECT_EQ(GreedyWith({.presence_penalty = -1.0f}, {2.0f, 2.5f}, {}, {0}), 0);
}

TEST(SequenceSamplerTest, RepetitionPenaltyAppliesBeforeFrequencyAndPresence) {
  // 2.0 / 2 - 0.5 * 1 - 0.25 = 0.25 (the other order would give 0.625).
  const SamplingParams all{.repetition_penalty = 2.0f, .presence_penalty = 0.25f, .frequency_penalty = 0.5f};
  EXPECT_EQ(GreedyWith(all, {2.0f, 0.2f}, {}, {0}), 0);
  EXPECT_EQ(GreedyWith(all, {2.0f, 0.3f}, {}, {0}), 1);
}

// ---- logprobs ----

TEST(SequenceSamplerTest, LogprobsAreRawTopNSortedWithChosenTokenAndRank) {
  const std::vector<float> logits = RandomLogits(1000, 5);
  const std::vector<double> expected = LogSoftmax(logits);
  std::vector<int32_t> by_logprob(1000);
  std::iota(by_logprob.begin(), by_logprob.end(), 0);
  std::stable_sort(by_logprob.begin(), by_logprob.end(),
                   [&](int32_t a, int32_t b) { return expected[a] > expected[b]; });
  // Penalties and temperature do not change the reported (raw) logprobs.
  SequenceSampler sampler = MakeSampler(
      {.temperature = 0.7f, .top_k = 20, .seed = 3, .repetition_penalty = 1.3f, .logprobs = 5}, 1000,
      {by_logprob[0], by_logprob[1]});
  for (int step = 0; step < 20; ++step) {
    const SampleResult r = sampler.Sample(logits).value();
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token_id, by_logprob[i]);
      EXPECT_NEAR(r.top_logprobs[i].logprob, expected[by_logprob[i]], 1e-5);
      if (i > 0) {
        EXPECT_GE(r.top_logprobs[i - 1].logprob, r.top_logprobs[i].logprob);
      }
    }
    ASSERT_TRUE(r.logprob.has_value());
    EXPECT_NEAR(*r.logprob, expected[r.token_id], 1e-5);
    const int32_t rank =
        static_cast<int32_t>(std::find(by_logprob.begin(), by_logprob.end(), r.token_id) - by_logprob.begin()) + 1;
    EXPECT_EQ(r.rank, rank);
    sampler.Append(r.token_id);
  }
}

TEST(SequenceSamplerTest, LogprobsZeroAndOff) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const std::vector<double> expected = LogSoftmax(logits);
  SequenceSampler zero = MakeSampler({.temperature = 0.0f, .logprobs = 0}, 3);
  const SampleResult r0 = zero.Sample(logits).value();
  EXPECT_EQ(r0.token_id, 2);
  EXPECT_TRUE(r0.top_logprobs.empty());
  EXPECT_EQ(r0.rank, 1);
  EXPECT_NEAR(r0.logprob.value(), expected[2], 1e-6);
  SequenceSampler off = MakeSampler({.temperature = 0.0f}, 3);
  const SampleResult r1 = off.Sample(logits).value();
  EXPECT_TRUE(r1.top_logprobs.empty());
  EXPECT_EQ(r1.rank, 0);
  EXPECT_FALSE(r1.logprob.has_value());
}

// ---- min_tokens, stop checking, errors ----

TEST(SequenceSamplerTest, MinTokensMasksEosAndStopTokens) {
  const std::vector<float> logits = {0.0f, 1.0f, 5.0f, 4.0f};  // 2 = EOS, 3 = stop token
  SequenceSampler sampler =
      MakeSampler({.temperature = 0.0f, .stop_token_ids = {3}, .min_tokens = 2}, 4, {}, /*eos=*/{2});
  EXPECT_EQ(SampleId(sampler, logits), 1);
  sampler.Append(1);
  EXPECT_EQ(SampleId(sampler, logits), 1);
  sampler.Append(1);
  EXPECT_EQ(SampleId(sampler, logits), 2);
  EXPECT_EQ(sampler.num_output_tokens(), 2);
}

TEST(StopCheckerTest, StopsOnEosStopTokensAndLength) {
  const std::vector<int32_t> eos = {2, 7};
  const StopChecker checker({.stop_token_ids = {9}, .max_tokens = 4}, eos);
  EXPECT_FALSE(checker.Check(5, 1).finished());
  EXPECT_EQ(checker.Check(7, 1).reason, FinishReason::kStop);
  EXPECT_FALSE(checker.Check(7, 1).stop_token_id.has_value());
  const StopDecision stop = checker.Check(9, 2);
  EXPECT_EQ(stop.reason, FinishReason::kStop);
  EXPECT_EQ(stop.stop_token_id, 9);
  EXPECT_EQ(checker.Check(5, 4).reason, FinishReason::kLength);
  EXPECT_EQ(checker.Check(2, 4).reason, FinishReason::kStop);  // EOS as the last allowed token
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
}

TEST(StopCheckerTest, IgnoreEosAndMinTokens) {
  const std::vector<int32_t> eos = {2};
  const StopChecker ignore({.stop_token_ids = {9}, .ignore_eos = true, .max_tokens = 4}, eos);
  EXPECT_FALSE(ignore.Check(2, 1).finished());
  EXPECT_EQ(ignore.Check(9, 1).reason, FinishReason::kStop);
  const StopChecker min({.max_tokens = 4, .min_tokens = 2}, eos);
  EXPECT_FALSE(min.Check(2, 1).finished());
  EXPECT_EQ(min.Check(2, 2).reason, FinishReason::kStop);
}

TEST(SequenceSamplerTest, SampleRejectsWrongSizeAndAllMaskedLogits) {
  SequenceSampler sampler = MakeSampler({}, 4);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 2.0f}).status().code(), absl::StatusCode::kInvalidArgument);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampler.Sample(std::vector<float>{-inf, -inf, NAN, -inf}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // NaN never wins; +inf does.
  SequenceSampler greedy = MakeSampler({.temperature = 0.0f}, 3);
  EXPECT_EQ(SampleId(greedy, {NAN, 1.0f, 0.0f}), 1);
  EXPECT_EQ(SampleId(sampler, {0.0f, inf, 1.0f, NAN}), 1);
}

TEST(SamplingParamsTest, ValidateNamesTheOffendingField) {
  // Each case sets one field out of range on otherwise default params.
  const std::vector<std::pair<std::string, std::function<void(SamplingParams&)>>> cases = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = NAN; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.5f; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = -2; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {1, 100}; }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = -1; }},
      {"min_tokens", [](SamplingParams& p) { p.max_tokens = 4, p.min_tokens = 5; }},
  };
  for (const auto& [field, mutate] : cases) {
    SamplingParams params;
    mutate(params);
    const absl::Status status = params.Validate(100);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field)) << status;
  }
  EXPECT_TRUE(SamplingParams{}.Validate(100).ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 1.0f, .logprobs = 20}
                   .Validate(100)
                   .ok()));
  EXPECT_EQ(SamplingParams{.logprobs = 8}.Validate(5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SamplingParams{.logprobs = 50}.Validate(100, /*max_logprobs=*/64).ok());
  // Create validates too, and checks the prompt.
  EXPECT_EQ(SequenceSampler::Create({.top_p = 2.0f}, 10, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_prompt = {1, 10};
  const auto bad = SequenceSampler::Create({}, 10, bad_prompt, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("prompt token id 10"));
}

}  // namespace
}  // namespace kvmesh::engine

namespace kvmesh::engine {
namespace {

// logit_bias: -100 bans a token outright (greedy and sampled), a positive bias moves the
// argmax, logprobs stay those of the raw logits; out-of-vocabulary ids and biases
// outside [-100, 100] are refused naming the field.
TEST(SequenceSamplerLogitBiasTest, BansAndBiasesTokens) {
  const std::vector<float> logits = {1.0f, 5.0f, 2.0f, 0.5f};
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 0;
  greedy.logit_bias = {{1, -100.0f}};
  auto s = SequenceSampler::Create(greedy, 4, {}, {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = s->Sample(logits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_id, 2);
  const SampleResult raw = ComputeRawLogprobs(logits, 2, 0);
  EXPECT_FLOAT_EQ(*r->logprob, *raw.logprob);  // raw logits, not biased ones
  greedy.logit_bias = {{3, 10.0f}};
  auto pushed = SequenceSampler::Create(greedy, 4, {}, {});
  ASSERT_TRUE(pushed.ok());
  EXPECT_EQ(pushed->Sample(logits)->token_id, 3);

  SamplingParams random;
  random.seed = 3;
  random.logit_bias = {{1, -100.0f}, {0, -100.0f}};
  auto sampled = SequenceSampler::Create(random, 4, {}, {});
  ASSERT_TRUE(sampled.ok());
  for (int i = 0; i < 200; ++i) {
    const int32_t id = sampled->Sample(logits)->token_id;
    ASSERT_TRUE(id == 2 || id == 3) << id;
  }

  SamplingParams bad;
  bad.logit_bias = {{4, 1.0f}};
  EXPECT_NE(SequenceSampler::Create(bad, 4, {}, {}).status().message().find("logit_bias"), std::string::npos);
  bad.logit_bias = {{0, 101.0f}};
  EXPECT_NE(SequenceSampler::Create(bad, 4, {}, {}).status().message().find("logit_bias"), std::string::npos);
  bad.logit_bias = {};
  bad.prompt_logprobs = 21;
  EXPECT_NE(SequenceSampler::Create(bad, 4, {}, {}).status().message().find("prompt_logprobs"), std::string::npos);
}

}  // namespace
}  // namespace kvmesh::engine
