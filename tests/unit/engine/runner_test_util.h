// Helpers of the tensor-parallel runner tests (CPU ranks in tensor_parallel_runner_test,
// GPU ranks in cuda_tensor_parallel_test): hand-built steps — five sequences prefilled at
// once (1 to 50 new tokens, logits for each), then decode steps on top of them, every
// chunk carrying its whole block table — and a bound that turns a hang into a failure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/model_runner.h"

namespace kvmesh::engine::testing_util {

// Runs `fn` and aborts the test binary with a message if it takes longer than `limit`:
// a hang must show up as a failure, not as a stuck CI job.
template <typename Fn>
auto WithinDeadline(absl::Duration limit, const char* what, Fn&& fn) {
  auto future = std::async(std::launch::async, std::forward<Fn>(fn));
  if (future.wait_for(absl::ToChronoMilliseconds(limit)) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s did not return within %s (hang)\n", what, absl::FormatDuration(limit).c_str());
    std::abort();
  }
  return future.get();
}

// The sequences' block tables and lengths so far; blocks are handed out in order.
struct RunnerSequences {
  int32_t block_size = 16;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> lengths;
  int32_t next_block = 0;
};

inline ModelBatch PrefillStep(int32_t vocab, RunnerSequences* s) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  ModelBatch batch;
  for (int32_t len : {1, 7, 16, 33, 50}) {
    SequenceChunk c;
    for (int32_t i = 0; i < len; ++i) c.token_ids.push_back(token(rng));
    for (int32_t b = 0; b < (len + s->block_size - 1) / s->block_size; ++b) c.block_table.push_back(s->next_block++);
    c.compute_logits = true;
    s->tables.push_back(c.block_table);
    s->lengths.push_back(len);
    batch.chunks.push_back(std::move(c));
  }
  return batch;
}

// One token for every sequence, a new block where the last one is full.
inline ModelBatch DecodeStep(int32_t vocab, RunnerSequences* s) {
  ModelBatch batch;
  for (size_t i = 0; i < s->tables.size(); ++i) {
    SequenceChunk c;
    c.start_position = s->lengths[i];
    c.token_ids = {(c.start_position * 31 + static_cast<int32_t>(i)) % vocab};
    if (c.start_position % s->block_size == 0) s->tables[i].push_back(s->next_block++);
    c.block_table = s->tables[i];
    c.compute_logits = true;
    ++s->lengths[i];
    batch.chunks.push_back(std::move(c));
  }
  return batch;
}

}  // namespace kvmesh::engine::testing_util
