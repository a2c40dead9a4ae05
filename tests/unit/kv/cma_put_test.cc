// Same-host puts by cross-memory attach (kv/transport/ucx/cma_put.h) against real
// processes: this one and a child that exits.
#include "kv/transport/ucx/cma_put.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kvmesh::kv {
namespace {

TEST(CmaPutTest, WritesIntoAProcessAndSaysWhyItCannot) {
  std::vector<std::byte> src(3 << 20), dst(3 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 31 + 7);
  ASSERT_TRUE(CmaWrite(::getpid(), src.data(), src.size(), reinterpret_cast<uint64_t>(dst.data())).ok());
  EXPECT_EQ(src, dst);
  // An address not mapped there.
  EXPECT_EQ(CmaWrite(::getpid(), src.data(), 64, 8).code(), absl::StatusCode::kInvalidArgument);
  // A process that is gone.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_EQ(CmaWrite(child, src.data(), 64, reinterpret_cast<uint64_t>(dst.data())).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvmesh::kv
