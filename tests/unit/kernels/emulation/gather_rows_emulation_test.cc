// The gather-and-add-rows kernel's own code (gather_rows_kernel.cuh) on the host emulation,
// with the launcher's grid: out[i, :] = a[rows[i], :] + b[rows[i], :], exact, with a row
// gathered twice and rows out of order.
#include "host_emulation/prelude.h"

#include "gather_rows/gather_rows_kernel.cuh"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "emulation_test_util.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(GatherRowsEmulationKernelTest, GathersAndAddsTheListedRowsExactly) {
  const int64_t width = 257, source_rows = 5;
  const std::vector<float> a = emulation_test::RandomNormal(static_cast<size_t>(source_rows * width), 1);
  const std::vector<float> b = emulation_test::RandomNormal(a.size(), 2);
  const std::vector<int32_t> rows = {4, 0, 4};
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  std::vector<float> out(static_cast<size_t>(num_rows * width), -1.f);
  host_emulation::EmulateGrid(gather_rows::GatherAddRowsGrid(num_rows, width), gather_rows::kThreads, [&] {
    gather_rows::GatherAddRowsKernel(a.data(), b.data(), rows.data(), width, out.data());
  });
  for (int64_t i = 0; i < num_rows; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      const size_t src = static_cast<size_t>(rows[static_cast<size_t>(i)] * width + j);
      ASSERT_EQ(out[static_cast<size_t>(i * width + j)], a[src] + b[src]) << "row " << i << " col " << j;
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
