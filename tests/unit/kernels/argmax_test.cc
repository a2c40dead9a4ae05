// The device argmax (kernels/argmax) against the host sampler's greedy path
// (SequenceSampler at temperature 0, no penalties), which it stands in for when the CUDA
// runner returns argmax tokens: the same token on every row, bit for bit the same rule —
// ties go to the lowest id, NaN never wins, +inf ties with FLT_MAX — and -1 where the
// sampler finds no finite logit. Vocabularies 32000, 128256 and an odd 1001 (the unaligned
// path). Skips where no GPU is present (CI), saying why.
#include "argmax/argmax.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "argmax_edge_rows.h"
#include "cuda_test_util.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

TEST(ArgmaxKernelTest, MatchesTheHostSamplersGreedyToken) {
  KVMESH_SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  for (int64_t vocab : {32000, 128256, 1001}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const std::vector<float> logits = test_util::ArgmaxEdgeRows(vocab, rng);
    const int64_t rows = test_util::kArgmaxEdgeRows;
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<int32_t> d_out(std::vector<int32_t>(rows, -7));
    ASSERT_EQ(LaunchArgmaxRows(d_logits.get(), rows, vocab, d_out.get(), nullptr), cudaSuccess);
    test_util::ExpectArgmaxEdgeRows(logits, vocab, d_out.Download());
  }
}

TEST(ArgmaxKernelTest, RejectsBadShapes) {
  EXPECT_EQ(LaunchArgmaxRows(nullptr, 1, 0, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxRows(nullptr, -1, 10, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchArgmaxRows(nullptr, 0, 10, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace kvmesh::kernels
