#include "core/memory_info.h"

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(MemoryInfoTest, ParsesMemAvailableInKilobytes) {
  const std::string meminfo =
      "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\nBuffers: 1 kB\n";
  auto bytes = ParseMemAvailableBytes(meminfo);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, int64_t{20000000} * 1024);
}

TEST(MemoryInfoTest, MissingLineIsInvalidArgument) {
  EXPECT_EQ(ParseMemAvailableBytes("MemTotal: 1 kB\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryInfoTest, ThisMachineHasSomeMemoryAvailable) {
  auto bytes = AvailableHostMemoryBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, 0);
}

}  // namespace
}  // namespace kvmesh
