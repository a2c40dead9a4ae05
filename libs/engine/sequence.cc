#include "engine/sequence.h"

#include <chrono>

namespace kvmesh::engine {

int32_t Sequence::num_output_tokens() const { return num_tokens() - request->num_prompt_tokens(); }

RequestState::RequestState(const EngineRequest& request, int64_t arrival)
    : request_id(request.request_id),
      prompt_token_ids(request.prompt_token_ids),
      sampling_params(request.sampling_params),
      n(request.n),
      priority(request.priority),
      arrival_order(arrival),
      eos_token_ids(request.eos_token_ids),
      cache_salt(request.cache_salt),
      stop_checker(request.sampling_params, request.eos_token_ids),
      resume_output_token_ids(request.resume_output_token_ids) {
  times.arrival = std::chrono::steady_clock::now();
}

bool RequestState::AllFinished() const {
  if (!forked && n > 1) return !seqs.empty() && seqs[0]->finished();
  for (const auto& seq : seqs) {
    if (!seq->finished()) return false;
  }
  return true;
}

SamplingParams RequestState::SampleParams(int32_t index) const {
  SamplingParams params = sampling_params;
  // NOTE: unsigned wrap-around is intended; sample 0 keeps the request's seed.
  if (params.seed.has_value()) params.seed = *params.seed + static_cast<uint64_t>(index);
  return params;
}

}  // namespace kvmesh::engine
