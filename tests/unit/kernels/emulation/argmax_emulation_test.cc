// The row-argmax kernel's own code (argmax_kernel.cuh) on the host emulation, with the
// launcher's grid, against the host sampler's greedy path (SequenceSampler at temperature
// 0), on argmax_test's rows (argmax_edge_rows.h): ties to the lowest id, NaN never wins, +inf
// ties with FLT_MAX, -1 for a row without a finite logit; an aligned vocabulary (the float4
// path) and an odd one. What this cannot check: the float4 loads' alignment on the device.
#include "host_emulation/prelude.h"

#include "argmax/argmax_kernel.cuh"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "argmax_edge_rows.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(ArgmaxEmulationKernelTest, MatchesTheHostSamplersGreedyToken) {
  std::mt19937 rng(17);
  for (int64_t vocab : {2048, 1001}) {
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " base offset " << offset);
      const std::vector<float> logits = test_util::ArgmaxEdgeRows(vocab, rng);
      // `offset` floats in, so the rows' base loses the alignment the float4 loads need.
      std::vector<float> padded(offset, 0.f);
      padded.insert(padded.end(), logits.begin(), logits.end());
      std::vector<int32_t> got(static_cast<size_t>(test_util::kArgmaxEdgeRows), -7);
      host_emulation::EmulateGrid(argmax::ArgmaxRowsGrid(test_util::kArgmaxEdgeRows), argmax::kThreads,
                                  [&] { argmax::ArgmaxRowsKernel(padded.data() + offset, vocab, got.data()); });
      test_util::ExpectArgmaxEdgeRows(logits, vocab, got);
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
