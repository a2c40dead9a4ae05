// step_staging_bench: the host time a device runner spends per step before the GPU can
// start (BuildStepMetadata + StageStep into the pinned buffer), for decode steps of batch
// 1/16/64/256 at contexts 1k/8k/32k, against the floor of copying the same bytes once
// (memcpy of the staged metadata). On a GPU decode step of a few milliseconds this is the
// CPU overhead that graph replay does not hide. Median of repeated runs.
//   step_staging_bench
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_timer.h"
#include "engine/step_metadata.h"
#include "engine/step_staging.h"

namespace {

using kvmesh::engine::ModelBatch;
using kvmesh::engine::SequenceChunk;

constexpr int32_t kBlock = 16;
constexpr int32_t kMaxModelLen = 32768;

}  // namespace

int main() {
  std::printf("%-8s %-8s %14s %14s %12s %10s\n", "batch", "context", "stage_us", "memcpy_us", "bytes", "ratio");
  for (int32_t batch : {1, 16, 64, 256}) {
    for (int32_t context : {1024, 8192, 32768}) {
      // A decode step: every sequence one token at position context - 1, with its own blocks.
      const int32_t blocks = context / kBlock;
      const int32_t num_blocks = batch * blocks;
      ModelBatch step;
      for (int32_t s = 0; s < batch; ++s) {
        SequenceChunk chunk;
        chunk.token_ids = {s + 1};
        chunk.start_position = context - 1;
        chunk.block_table.resize(static_cast<size_t>(blocks));
        for (int32_t b = 0; b < blocks; ++b) chunk.block_table[static_cast<size_t>(b)] = s * blocks + b;
        chunk.compute_logits = true;
        chunk.argmax_only = true;
        step.chunks.push_back(std::move(chunk));
      }
      const auto layout = kvmesh::engine::StagingLayout::For(2048, 256, kMaxModelLen / kBlock, 1024);
      std::vector<std::byte> staging(layout.total), copy(layout.total);
      kvmesh::engine::StepMetadata meta;
      size_t bytes = 0;
      const double stage = kvmesh::bench::MedianSeconds(
          [&] {
            if (!kvmesh::engine::BuildStepMetadata(step, kBlock, num_blocks, 32000, &meta).ok()) std::abort();
            const auto staged = kvmesh::engine::StageStep(
                meta, step, layout, {.max_num_seqs = 256, .max_model_len = kMaxModelLen, .block_size_tokens = kBlock},
                staging.data());
            bytes = staged.upload_bytes;
          },
          20, 0.2, 2000);
      const double floor = kvmesh::bench::MedianSeconds([&] { std::memcpy(copy.data(), staging.data(), bytes); }, 20,
                                                        0.05, 20000);
      std::printf("%-8d %-8d %14.1f %14.2f %12zu %9.1fx\n", batch, context, stage * 1e6, floor * 1e6, bytes,
                  stage / floor);
    }
  }
  return 0;
}
