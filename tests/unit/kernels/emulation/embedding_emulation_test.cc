// The embedding kernel's own code (embedding_kernel.cuh) on the host emulation, with the
// launcher's grid, against the CPU backends' Embedding: f32, bf16 and f16 tables, a width
// of two column blocks, exact (as cuda_backend_test); an id outside the vocabulary gives a
// NaN row (the launcher's contract; the backends take only valid ids).
#include "host_emulation/prelude.h"

#include "embedding/embedding_kernel.cuh"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

template <typename T>
std::vector<float> Emulate(const std::vector<int32_t>& ids, const std::vector<T>& table, EmbeddingDType dtype,
                           int64_t vocab, int64_t hidden) {
  const int64_t tokens = static_cast<int64_t>(ids.size());
  std::vector<float> out(static_cast<size_t>(tokens * hidden), -1.f);
  host_emulation::EmulateGrid(embedding::EmbeddingGrid(tokens, hidden), embedding::kThreads, [&] {
    embedding::EmbeddingKernel<T>(ids.data(), table.data(), dtype, vocab, hidden, out.data());
  });
  return out;
}

TEST(EmbeddingEmulationKernelTest, ExactForEveryTableType) {
  const int64_t vocab = 7, hidden = 259;
  const std::vector<int32_t> ids = {3, 0, 6};
  const std::vector<float> values = emulation_test::RandomNormal(static_cast<size_t>(vocab * hidden), 5);
  std::vector<uint16_t> bf16, f16;
  for (float v : values) {
    bf16.push_back(F32ToBf16(v));
    f16.push_back(F32ToF16(v));
  }
  for (const auto& oracle : emulation_test::Oracles()) {
    SCOPED_TRACE(oracle->name());
    for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBf16, EmbeddingDType::kF16}) {
      SCOPED_TRACE(static_cast<int>(dtype));
      const std::vector<float> got = dtype == EmbeddingDType::kF32 ? Emulate(ids, values, dtype, vocab, hidden)
                                     : dtype == EmbeddingDType::kBf16 ? Emulate(ids, bf16, dtype, vocab, hidden)
                                                                       : Emulate(ids, f16, dtype, vocab, hidden);
      const TensorView table = dtype == EmbeddingDType::kF32
                                   ? TensorView::Contiguous(const_cast<float*>(values.data()), DType::kF32,
                                                            {vocab, hidden})
                                   : TensorView::Contiguous(dtype == EmbeddingDType::kBf16 ? bf16.data() : f16.data(),
                                                            dtype == EmbeddingDType::kBf16 ? DType::kBF16 : DType::kF16,
                                                            {vocab, hidden});
      std::vector<float> want(got.size());
      oracle->Embedding(ids, table, TensorView::Contiguous(want.data(), DType::kF32, {3, hidden}));
      EXPECT_EQ(got, want);
    }
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
