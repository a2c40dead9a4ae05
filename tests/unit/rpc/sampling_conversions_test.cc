#include "rpc/sampling_conversions.h"

#include <gtest/gtest.h>

namespace kvmesh::rpc {
namespace {

bool Equal(const engine::SamplingParams& a, const engine::SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
         a.seed == b.seed && a.repetition_penalty == b.repetition_penalty &&
         a.presence_penalty == b.presence_penalty && a.frequency_penalty == b.frequency_penalty &&
         a.logprobs == b.logprobs && a.stop_token_ids == b.stop_token_ids && a.ignore_eos == b.ignore_eos &&
         a.max_tokens == b.max_tokens && a.min_tokens == b.min_tokens;
}

TEST(SamplingConversionsTest, EmptyProtoGivesVllmDefaults) {
  const auto params = SamplingParamsFromProto(v1::SamplingParams());
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_TRUE(Equal(*params, engine::SamplingParams()));
  EXPECT_EQ(params->temperature, 1.0f);
  EXPECT_EQ(params->max_tokens, 16);
  EXPECT_EQ(params->logprobs, -1);
  EXPECT_FALSE(params->seed.has_value());
}

TEST(SamplingConversionsTest, EveryFieldRoundTrips) {
  engine::SamplingParams params;
  params.temperature = 0.0f;  // greedy: distinct from "unset"
  params.top_k = 40;
  params.top_p = 0.9f;
  params.min_p = 0.05f;
  params.seed = 1234567890123ull;
  params.repetition_penalty = 1.1f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = -0.25f;
  params.logprobs = 0;  // chosen token only: distinct from off
  params.stop_token_ids = {7, 11};
  params.ignore_eos = true;
  params.max_tokens = 321;
  params.min_tokens = 3;
  v1::SamplingParams proto;
  SamplingParamsToProto(params, &proto);
  // Through the wire too.
  v1::SamplingParams parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  const auto back = SamplingParamsFromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Equal(*back, params));
  EXPECT_EQ(back->temperature, 0.0f);
  EXPECT_EQ(back->logprobs, 0);
}

TEST(SamplingConversionsTest, DefaultsRoundTrip) {
  v1::SamplingParams proto;
  SamplingParamsToProto(engine::SamplingParams(), &proto);
  EXPECT_FALSE(proto.has_seed());
  EXPECT_FALSE(proto.has_logprobs());
  const auto back = SamplingParamsFromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(Equal(*back, engine::SamplingParams()));
}

TEST(SamplingConversionsTest, LogitBiasAndPromptLogprobsRoundTrip) {
  v1::SamplingParams proto;
  (*proto.mutable_logit_bias())[5] = 2.0f;
  (*proto.mutable_logit_bias())[1] = -100.0f;
  proto.set_prompt_logprobs(1);
  const auto params = SamplingParamsFromProto(proto);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->prompt_logprobs, 1);
  ASSERT_EQ(params->logit_bias.size(), 2u);
  EXPECT_EQ(params->logit_bias[0].first, 1);  // sorted by token id
  EXPECT_EQ(params->logit_bias[0].second, -100.0f);
  EXPECT_EQ(params->logit_bias[1].first, 5);
  v1::SamplingParams back;
  SamplingParamsToProto(*params, &back);
  EXPECT_EQ(back.logit_bias().size(), 2);
  EXPECT_EQ(back.logit_bias().at(5), 2.0f);
  EXPECT_EQ(back.prompt_logprobs(), 1);
}

TEST(SamplingConversionsTest, NumSamples) {
  v1::SamplingParams proto;
  EXPECT_EQ(*NumSamplesFromProto(proto), 1);
  proto.set_n(4);
  EXPECT_EQ(*NumSamplesFromProto(proto), 4);
  proto.set_n(-1);
  EXPECT_EQ(NumSamplesFromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SamplingParamsFromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplingConversionsTest, SampleResultToProto) {
  engine::SampleResult result;
  result.token_id = 42;
  result.logprob = -0.5f;
  result.rank = 2;
  result.top_logprobs = {{.token_id = 7, .logprob = -0.25f}, {.token_id = 42, .logprob = -0.5f}};
  v1::TokenLogprob proto;
  SampleResultToProto(result, &proto);
  EXPECT_EQ(proto.token_id(), 42);
  EXPECT_EQ(proto.logprob(), -0.5f);
  EXPECT_EQ(proto.rank(), 2);
  ASSERT_EQ(proto.top_logprobs_size(), 2);
  EXPECT_EQ(proto.top_logprobs(0).token_id(), 7);
  EXPECT_EQ(proto.top_logprobs(0).logprob(), -0.25f);
}

TEST(SamplingConversionsTest, FinishReasonsRoundTrip) {
  using R = engine::CompletionFinishReason;
  for (R reason : {R::kNone, R::kStop, R::kLength, R::kAbort, R::kError}) {
    EXPECT_EQ(FinishReasonFromProto(FinishReasonToProto(reason)), reason);
  }
  EXPECT_EQ(FinishReasonToProto(R::kLength), v1::FINISH_REASON_LENGTH);
}

}  // namespace
}  // namespace kvmesh::rpc
