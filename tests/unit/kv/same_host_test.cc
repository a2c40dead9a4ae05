// Which peers share this host and what UCX_TLS allows between them
// (kv/transport/ucx/same_host.h).
#include "kv/transport/ucx/same_host.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace kvmesh::kv {
namespace {

// Sets UCX_TLS for one scope and restores what was there.
class ScopedUcxTls {
 public:
  explicit ScopedUcxTls(const char* value) {
    const char* saved = std::getenv("UCX_TLS");
    had_ = saved != nullptr;
    if (had_) saved_ = saved;
    if (value == nullptr) {
      ::unsetenv("UCX_TLS");
    } else {
      ::setenv("UCX_TLS", value, 1);
    }
  }
  ~ScopedUcxTls() {
    if (had_) {
      ::setenv("UCX_TLS", saved_.c_str(), 1);
    } else {
      ::unsetenv("UCX_TLS");
    }
  }

 private:
  bool had_ = false;
  std::string saved_;
};

// An empty value reads the environment's UCX_TLS (tcp: neither cma nor shared memory),
// else leaves the choice to UCX (which includes both).
void ExpectEmptyFollowsTheEnvironment(bool (*allows)(std::string_view)) {
  {
    ScopedUcxTls tls("tcp");
    EXPECT_FALSE(allows(""));
  }
  ScopedUcxTls none(nullptr);
  EXPECT_TRUE(allows(""));
}

TEST(SameHostTest, IdentityNamesThisHostAndPidNamespace) {
  const std::string id = LocalHostIdentity();
  ASSERT_FALSE(id.empty());
  EXPECT_NE(id.find('/'), std::string::npos) << id;
  EXPECT_EQ(id, LocalHostIdentity());
}

TEST(SameHostTest, TlsValuesThatAllowCma) {
  EXPECT_TRUE(UcxTlsAllowsCma("sm"));
  EXPECT_TRUE(UcxTlsAllowsCma("tcp,cma"));
  EXPECT_TRUE(UcxTlsAllowsCma("all"));
  EXPECT_TRUE(UcxTlsAllowsCma("^tcp"));
  EXPECT_FALSE(UcxTlsAllowsCma("tcp"));
  EXPECT_FALSE(UcxTlsAllowsCma("^sm"));
  EXPECT_FALSE(UcxTlsAllowsCma("posix,sysv"));
  ExpectEmptyFollowsTheEnvironment(&UcxTlsAllowsCma);
}

TEST(SameHostTest, TlsValuesThatAllowSharedMemoryMessages) {
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("sm"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("shm,cma"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("posix"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("tcp, sysv"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("all"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("^tcp"));
  EXPECT_TRUE(UcxTlsAllowsSharedMemory("^posix"));  // sysv is left
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("^posix,sysv"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("^sm"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("tcp"));
  EXPECT_FALSE(UcxTlsAllowsSharedMemory("tcp,cma"));  // cma carries no messages
  ExpectEmptyFollowsTheEnvironment(&UcxTlsAllowsSharedMemory);
}

}  // namespace
}  // namespace kvmesh::kv
