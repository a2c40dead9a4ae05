#include "core/file_util.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(FileUtilTest, WriteThenReadRoundTrips) {
  const std::string path = JoinPath(testing::TempDir(), "file_util_test.bin");
  const std::string data("a\0b\xff", 4);
  ASSERT_TRUE(WriteStringToFile(path, data).ok());
  auto read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, data);
  EXPECT_TRUE(FileExists(path));
}

TEST(FileUtilTest, MissingFileIsNotFoundAndNamesThePath) {
  auto read = ReadFileToString("/nonexistent/kvmesh/x.json");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(read.status().message()).find("/nonexistent/kvmesh/x.json"), std::string::npos);
}

TEST(FileUtilTest, JoinPathAddsOneSlash) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
}

}  // namespace
}  // namespace kvmesh
