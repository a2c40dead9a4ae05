#include "core/huge_pages.h"

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(HugePagesTest, MemoryIsHugePageAlignedAndWholePagesAreUsable) {
  for (const int64_t bytes : {int64_t{1}, int64_t{4096}, int64_t{kHugePageBytes}, int64_t{kHugePageBytes} + 1}) {
    HugePageMemory memory = AllocateHugePageMemory(bytes);
    ASSERT_NE(memory, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.get()) % kHugePageBytes, 0u) << bytes;
    // Everything up to the rounded size is the caller's.
    const size_t rounded = RoundUpToHugePages(bytes);
    EXPECT_EQ(rounded % kHugePageBytes, 0u);
    EXPECT_GE(rounded, static_cast<size_t>(bytes));
    EXPECT_LT(rounded, static_cast<size_t>(bytes) + kHugePageBytes);
    std::memset(memory.get(), 0x5a, rounded);
    EXPECT_EQ(static_cast<unsigned char>(memory.get()[rounded - 1]), 0x5a);
  }
}

TEST(HugePagesTest, NothingIsAllocatedForNoBytes) {
  EXPECT_EQ(AllocateHugePageMemory(0), nullptr);
  EXPECT_EQ(AllocateHugePageMemory(-5), nullptr);
}

}  // namespace
}  // namespace kvmesh
