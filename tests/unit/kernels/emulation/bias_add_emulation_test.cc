// The bias-add kernel's own code (bias_add_kernel.cuh) on the host emulation, with the
// launcher's grid: out[r, j] + bias[j] for every row, exact (one f32 add, as the CPU path).
#include "host_emulation/prelude.h"

#include "bias_add/bias_add_kernel.cuh"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(BiasAddEmulationKernelTest, AddsTheBiasToEveryRowExactly) {
  const int64_t rows = 3, n = 259;
  const std::vector<float> in = emulation_test::RandomNormal(static_cast<size_t>(rows * n), 3);
  const std::vector<float> bias = emulation_test::RandomNormal(static_cast<size_t>(n), 4);
  std::vector<float> out = in;
  host_emulation::EmulateGrid(bias_add::BiasAddGrid(rows, n), bias_add::kThreads,
                              [&] { bias_add::BiasAddKernel(out.data(), bias.data(), n); });
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(r * n + j);
      ASSERT_EQ(out[i], in[i] + bias[static_cast<size_t>(j)]) << "row " << r << " col " << j;
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
