// Conversions between kvmesh.v1 sampling messages (common.proto) and libs/engine's
// SamplingParams, SampleResult and finish reasons.
//
// Proto fields marked `optional` take vLLM's defaults when unset (temperature 1,
// top_p 1, repetition_penalty 1, max_tokens 16, logprobs off). SamplingParamsFromProto
// checks only what the engine cannot express (logit_bias, prompt_logprobs: Unimplemented;
// n < 0: InvalidArgument); ranges that depend on the model (vocabulary, max logprobs)
// are SamplingParams::Validate's. Stop strings are the router's and are not carried.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "kvmesh/v1/common.pb.h"

namespace kvmesh::rpc {

absl::StatusOr<engine::SamplingParams> SamplingParamsFromProto(const v1::SamplingParams& proto);
// Writes every field engine::SamplingParams has (always setting the `optional` ones,
// so the proto round-trips exactly); leaves n, stop strings and logit_bias alone.
void SamplingParamsToProto(const engine::SamplingParams& params, v1::SamplingParams* proto);

// The request's parallel sample count: n == 0 means 1. InvalidArgument for n < 0.
absl::StatusOr<int32_t> NumSamplesFromProto(const v1::SamplingParams& proto);

// The chosen token's logprob, rank and top alternatives (token text left empty).
void SampleResultToProto(const engine::SampleResult& result, v1::TokenLogprob* proto);
// The inverse (token text ignored): logprob always set, as it is on the wire.
engine::SampleResult SampleResultFromProto(const v1::TokenLogprob& proto);

v1::FinishReason FinishReasonToProto(engine::CompletionFinishReason reason);
engine::CompletionFinishReason FinishReasonFromProto(v1::FinishReason reason);

}  // namespace kvmesh::rpc
