// MeasureDiskReadBound: the benchmarks' disk read bound. No speed is asserted (that is
// the benchmarks' business): only that it reads what it says, and refuses bad options.
#include "kv/disk_read_bound.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace kvmesh::kv {
namespace {

class DiskReadBoundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) / ("read-bound-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(DiskReadBoundTest, ReadsAFreshFileOfWholeIosAndLeavesNothingBehind) {
  absl::StatusOr<DiskReadBound> bound =
      MeasureDiskReadBound({.directory = dir_, .file_bytes = 1'000'000, .io_bytes = 65536, .queue_depth = 8});
  if (!bound.ok() && bound.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no O_DIRECT here: " << bound.status();
  }
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_GT(bound->bytes_per_second, 0);
  EXPECT_EQ(bound->io_bytes, 65536);
  EXPECT_EQ(bound->file_bytes, 16 * 65536) << "rounded up to whole I/Os";
  EXPECT_EQ(bound->queue_depth, 8);
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "the scratch file is removed";
}

TEST_F(DiskReadBoundTest, ReadsAnExistingFileWithoutTouchingIt) {
  std::filesystem::create_directories(dir_);
  const std::string path = dir_ + "/slab.dat";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string block(4096, 'k');
    for (int i = 0; i < 64; ++i) out << block;
  }
  absl::StatusOr<DiskReadBound> bound = MeasureDiskReadBound(
      {.file_bytes = 32 * 4096, .io_bytes = 8192, .queue_depth = 4, .repeats = 2, .existing_file = path});
  if (!bound.ok() && bound.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no O_DIRECT here: " << bound.status();
  }
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_GT(bound->bytes_per_second, 0);
  EXPECT_EQ(bound->file_bytes, 32 * 4096);
  EXPECT_EQ(std::filesystem::file_size(path), 64u * 4096) << "an existing file is only read";
}

TEST_F(DiskReadBoundTest, RejectsNonPositiveSizes) {
  EXPECT_EQ(MeasureDiskReadBound({.directory = dir_, .file_bytes = 0, .io_bytes = 4096}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureDiskReadBound({.directory = dir_, .file_bytes = 4096, .io_bytes = 4096, .queue_depth = 0})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::kv
