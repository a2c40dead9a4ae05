// The block-table kernels' own code (block_tables_kernel.cuh) on the host emulation, with
// the launchers' grids: updates scattered into the row array, and the step's table gathered
// from it as engine::GatherBlockTableRows (the host's statement of the same) computes it,
// with a padding row (-1), a row gathered twice, contexts past the output's columns and a
// partial last block.
#include "host_emulation/prelude.h"

#include "block_tables/block_tables_kernel.cuh"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "engine/step_staging.h"
#include "host_emulation/grid.h"

namespace kvmesh::kernels {
namespace {

TEST(BlockTablesEmulationKernelTest, ScattersUpdatesThenGathersRowsAsTheHostDoes) {
  const int64_t stride = 300, num_rows = 4;  // a stride over one CTA's width
  std::vector<int32_t> row_array(static_cast<size_t>(num_rows * stride), 7);
  std::vector<int32_t> updates;  // (index, block) pairs
  for (int32_t j = 0; j < 280; ++j) updates.insert(updates.end(), {static_cast<int32_t>(2 * stride + j), 1000 + j});
  updates.insert(updates.end(), {0, 5, 1, 6, static_cast<int32_t>(3 * stride + 299), 42});
  const int64_t num_updates = static_cast<int64_t>(updates.size() / 2);
  host_emulation::EmulateGrid(block_tables::ApplyUpdatesGrid(num_updates), block_tables::kThreads,
                              [&] { block_tables::ApplyUpdatesKernel(updates.data(), num_updates, row_array.data()); });
  EXPECT_EQ(row_array[0], 5);
  EXPECT_EQ(row_array[1], 6);
  EXPECT_EQ(row_array[2], 7);  // untouched
  EXPECT_EQ(row_array[2 * stride + 279], 1279);
  EXPECT_EQ(row_array[3 * stride + 299], 42);

  const int32_t block = 16;
  const std::vector<int32_t> rows = {2, 0, -1, 2, 3};
  const std::vector<int32_t> context_lens = {280 * block, 17, 1, 100 * block - 3, 300 * block};
  const int64_t seqs = static_cast<int64_t>(rows.size()), cols = 290;
  std::vector<int32_t> out(static_cast<size_t>(seqs * cols), -9), expected(out.size(), -9);
  host_emulation::EmulateGrid(block_tables::GatherRowsGrid(seqs, cols), block_tables::kThreads, [&] {
    block_tables::GatherRowsKernel(row_array.data(), stride, rows.data(), context_lens.data(), block, cols, out.data());
  });
  engine::GatherBlockTableRows(row_array, stride, rows, context_lens, block, seqs, cols, expected.data());
  EXPECT_EQ(out, expected);
  EXPECT_EQ(out[0], 1000);
  EXPECT_EQ(out[279], 1279);
  EXPECT_EQ(out[280], 0);        // past the sequence's blocks
  EXPECT_EQ(out[cols + 1], 6);   // 17 tokens: two blocks of row 0
  EXPECT_EQ(out[cols + 2], 0);
  EXPECT_EQ(out[2 * cols], 0);   // padding row
  EXPECT_EQ(out[3 * cols + 99], 1099);
  EXPECT_EQ(out[3 * cols + 100], 0);
  EXPECT_EQ(out[4 * cols + 289], 7);  // row 3 is full: cut at the output's columns
}

}  // namespace
}  // namespace kvmesh::kernels
