// Helpers shared by the engine and scheduler tests (with fake_model_runner.h).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sampler.h"

namespace kvmesh::engine::testing {

inline constexpr int32_t kTestBlockSize = 4;
inline constexpr int32_t kTestVocab = 32;

// Tokens start, start+1, ... modulo the test vocabulary.
inline std::vector<int32_t> TestPrompt(int32_t n, int32_t start = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (start + i) % kTestVocab;
  return v;
}

// Greedy sampling of exactly `max_tokens` tokens (EOS ignored).
inline SamplingParams GreedyParams(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace kvmesh::engine::testing
