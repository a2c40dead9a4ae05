#include "rpc/sampling_conversions.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvmesh::rpc {

absl::StatusOr<engine::SamplingParams> SamplingParamsFromProto(const v1::SamplingParams& proto) {
  if (proto.n() < 0) return absl::InvalidArgumentError(absl::StrCat("sampling.n: must be >= 1, got ", proto.n()));
  engine::SamplingParams params;  // vLLM's defaults for whatever is unset
  if (proto.has_temperature()) params.temperature = proto.temperature();
  if (proto.has_top_p()) params.top_p = proto.top_p();
  params.top_k = proto.top_k() == 0 ? -1 : proto.top_k();  // both mean off; -1 is the engine's spelling
  params.min_p = proto.min_p();
  if (proto.has_seed()) params.seed = proto.seed();
  if (proto.has_repetition_penalty()) params.repetition_penalty = proto.repetition_penalty();
  params.presence_penalty = proto.presence_penalty();
  params.frequency_penalty = proto.frequency_penalty();
  if (proto.has_max_tokens()) params.max_tokens = proto.max_tokens();
  params.min_tokens = proto.min_tokens();
  params.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  params.ignore_eos = proto.ignore_eos();
  params.logprobs = proto.has_logprobs() ? proto.logprobs() : -1;
  params.prompt_logprobs = proto.has_prompt_logprobs() ? proto.prompt_logprobs() : -1;
  // A map's order is unspecified: sort so that the same request gives the same params.
  for (const auto& [id, bias] : proto.logit_bias()) params.logit_bias.emplace_back(id, bias);
  std::sort(params.logit_bias.begin(), params.logit_bias.end());
  return params;
}

void SamplingParamsToProto(const engine::SamplingParams& params, v1::SamplingParams* proto) {
  proto->set_temperature(params.temperature);
  proto->set_top_p(params.top_p);
  proto->set_top_k(params.top_k);
  proto->set_min_p(params.min_p);
  if (params.seed.has_value()) {
    proto->set_seed(*params.seed);
  } else {
    proto->clear_seed();
  }
  proto->set_repetition_penalty(params.repetition_penalty);
  proto->set_presence_penalty(params.presence_penalty);
  proto->set_frequency_penalty(params.frequency_penalty);
  proto->set_max_tokens(params.max_tokens);
  proto->set_min_tokens(params.min_tokens);
  proto->mutable_stop_token_ids()->Assign(params.stop_token_ids.begin(), params.stop_token_ids.end());
  proto->set_ignore_eos(params.ignore_eos);
  if (params.logprobs >= 0) {
    proto->set_logprobs(params.logprobs);
  } else {
    proto->clear_logprobs();
  }
  if (params.prompt_logprobs >= 0) {
    proto->set_prompt_logprobs(params.prompt_logprobs);
  } else {
    proto->clear_prompt_logprobs();
  }
  proto->clear_logit_bias();
  for (const auto& [id, bias] : params.logit_bias) (*proto->mutable_logit_bias())[id] = bias;
}

absl::StatusOr<int32_t> NumSamplesFromProto(const v1::SamplingParams& proto) {
  if (proto.n() < 0) return absl::InvalidArgumentError(absl::StrCat("sampling.n: must be >= 1, got ", proto.n()));
  return proto.n() == 0 ? 1 : proto.n();
}

void SampleResultToProto(const engine::SampleResult& result, v1::TokenLogprob* proto) {
  proto->set_token_id(result.token_id);
  proto->set_logprob(result.logprob.value_or(0.0f));
  proto->set_rank(result.rank);
  proto->clear_top_logprobs();
  for (const engine::TokenLogprob& top : result.top_logprobs) {
    v1::TopLogprob* entry = proto->add_top_logprobs();
    entry->set_token_id(top.token_id);
    entry->set_logprob(top.logprob);
  }
}

engine::SampleResult SampleResultFromProto(const v1::TokenLogprob& proto) {
  engine::SampleResult result;
  result.token_id = proto.token_id();
  result.logprob = proto.logprob();
  result.rank = proto.rank();
  for (const v1::TopLogprob& top : proto.top_logprobs()) {
    result.top_logprobs.push_back(engine::TokenLogprob{.token_id = top.token_id(), .logprob = top.logprob()});
  }
  return result;
}

v1::FinishReason FinishReasonToProto(engine::CompletionFinishReason reason) {
  switch (reason) {
    case engine::CompletionFinishReason::kNone: return v1::FINISH_REASON_UNSPECIFIED;
    case engine::CompletionFinishReason::kStop: return v1::FINISH_REASON_STOP;
    case engine::CompletionFinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case engine::CompletionFinishReason::kAbort: return v1::FINISH_REASON_ABORT;
    case engine::CompletionFinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

engine::CompletionFinishReason FinishReasonFromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_UNSPECIFIED: return engine::CompletionFinishReason::kNone;
    case v1::FINISH_REASON_STOP: return engine::CompletionFinishReason::kStop;
    case v1::FINISH_REASON_LENGTH: return engine::CompletionFinishReason::kLength;
    case v1::FINISH_REASON_ABORT: return engine::CompletionFinishReason::kAbort;
    default: return engine::CompletionFinishReason::kError;
  }
}

}  // namespace kvmesh::rpc
