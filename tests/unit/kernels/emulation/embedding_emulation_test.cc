// The embedding kernel's own code (embedding_kernel.cuh) on the host emulation, with the
// launchers' grid and arguments, against the CPU backends' Embedding and EmbeddingShard: f32,
// bf16 and f16 tables, a width of two column blocks, exact (as cuda_backend_test); an id
// outside the vocabulary gives a NaN row (LaunchEmbedding's contract; the backends take only
// valid ids), an id outside a shard a row of zeros (LaunchEmbeddingShard's).
#include "host_emulation/prelude.h"

#include "embedding/embedding_kernel.cuh"

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

// What LaunchEmbeddingShard (outside 0) or, with first_id 0, LaunchEmbedding (outside NaN)
// runs: `table` holds the rows of ids first_id .. first_id + vocab - 1.
template <typename T>
std::vector<float> Emulate(const std::vector<int32_t>& ids, const std::vector<T>& table, EmbeddingDType dtype,
                           int64_t vocab, int64_t hidden, int64_t first_id = 0, float outside = NAN) {
  const int64_t tokens = static_cast<int64_t>(ids.size());
  std::vector<float> out(static_cast<size_t>(tokens * hidden), -1.f);
  host_emulation::EmulateGrid(embedding::EmbeddingGrid(tokens, hidden), embedding::kThreads, [&] {
    embedding::EmbeddingKernel<T>(ids.data(), table.data(), dtype, first_id, vocab, hidden, outside, out.data());
  });
  return out;
}

// A seeded [rows, hidden] table in each type, the kernel (rows of ids first_id ..) run over
// each, and `oracle_op` (an oracle backend's op into `out`) giving the same bits.
using OracleOp = std::function<void(backend::Backend& oracle, const TensorView& table, const TensorView& out)>;
void ExpectExactForEveryTableType(const std::vector<int32_t>& ids, int64_t rows, int64_t hidden, uint32_t seed,
                                  int64_t first_id, float outside, const OracleOp& oracle_op) {
  const int64_t tokens = static_cast<int64_t>(ids.size());
  const std::vector<float> values = emulation_test::RandomNormal(static_cast<size_t>(rows * hidden), seed);
  std::vector<uint16_t> bf16, f16;
  for (float v : values) {
    bf16.push_back(F32ToBf16(v));
    f16.push_back(F32ToF16(v));
  }
  for (const auto& oracle : emulation_test::Oracles()) {
    SCOPED_TRACE(oracle->name());
    for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBf16, EmbeddingDType::kF16}) {
      SCOPED_TRACE(static_cast<int>(dtype));
      const std::vector<float> got =
          dtype == EmbeddingDType::kF32    ? Emulate(ids, values, dtype, rows, hidden, first_id, outside)
          : dtype == EmbeddingDType::kBf16 ? Emulate(ids, bf16, dtype, rows, hidden, first_id, outside)
                                           : Emulate(ids, f16, dtype, rows, hidden, first_id, outside);
      const TensorView table =
          dtype == EmbeddingDType::kF32
              ? TensorView::Contiguous(const_cast<float*>(values.data()), DType::kF32, {rows, hidden})
              : TensorView::Contiguous(dtype == EmbeddingDType::kBf16 ? bf16.data() : f16.data(),
                                       dtype == EmbeddingDType::kBf16 ? DType::kBF16 : DType::kF16, {rows, hidden});
      std::vector<float> want(got.size());
      oracle_op(*oracle, table, TensorView::Contiguous(want.data(), DType::kF32, {tokens, hidden}));
      EXPECT_EQ(got, want);
    }
  }
}

TEST(EmbeddingEmulationKernelTest, ExactForEveryTableType) {
  const std::vector<int32_t> ids = {3, 0, 6};
  ExpectExactForEveryTableType(ids, /*rows=*/7, /*hidden=*/259, /*seed=*/5, /*first_id=*/0, NAN,
                               [&](backend::Backend& oracle, const TensorView& table, const TensorView& out) {
                                 oracle.Embedding(ids, table, out);
                               });
}

// A shard of rows 3..6 of the vocabulary (stored as those 4 rows): ids below, inside and
// above it, as the CPU backends' EmbeddingShard computes them (zeros outside).
TEST(EmbeddingEmulationKernelTest, ShardIsExactForEveryTableTypeAndZeroElsewhere) {
  const std::vector<int32_t> ids = {0, 3, 6, 7, 2, 5, 100};
  const int64_t first_id = 3;
  ExpectExactForEveryTableType(ids, /*rows=*/4, /*hidden=*/259, /*seed=*/6, first_id, 0.f,
                               [&](backend::Backend& oracle, const TensorView& table, const TensorView& out) {
                                 oracle.EmbeddingShard(ids, table, first_id, out);
                               });
  // The kernel itself: id 0 is not this shard's, so its row is +0.
  const std::vector<float> table(4 * 33, 1.f);
  const std::vector<float> out = Emulate(ids, table, EmbeddingDType::kF32, 4, 33, first_id, 0.f);
  for (int64_t j = 0; j < 33; ++j) {
    EXPECT_EQ(std::signbit(out[static_cast<size_t>(j)]), false);
    EXPECT_EQ(out[static_cast<size_t>(j)], 0.f);
    EXPECT_EQ(out[static_cast<size_t>(33 + j)], 1.f);
  }
}

TEST(EmbeddingEmulationKernelTest, IdOutsideTheVocabularyGivesNaN) {
  const int64_t vocab = 4, hidden = 33;
  const std::vector<float> table(static_cast<size_t>(vocab * hidden), 1.f);
  const std::vector<float> out = Emulate(std::vector<int32_t>{1, 4, -1}, table, EmbeddingDType::kF32, vocab, hidden);
  for (int64_t j = 0; j < hidden; ++j) {
    EXPECT_EQ(out[static_cast<size_t>(j)], 1.f);
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(hidden + j)]));
    EXPECT_TRUE(std::isnan(out[static_cast<size_t>(2 * hidden + j)]));
  }
}

}  // namespace
}  // namespace kvmesh::kernels
