// The CPU count the kernels size themselves by (libs/core/cpu_quota.h): the cgroup
// files' formats as the kernel writes them, and the bound against the affinity mask.
#include "core/cpu_quota.h"

#include <sched.h>

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(CpuQuotaTest, CgroupV2CpuMaxGivesTheQuotaInCpus) {
  EXPECT_EQ(CpuQuotaFromCpuMax("400000 100000\n"), 4.0);
  EXPECT_EQ(CpuQuotaFromCpuMax("150000 100000"), 1.5);  // limits.cpu: 1500m
  EXPECT_EQ(CpuQuotaFromCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax(""), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax("400000"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax("abc 100000"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax("400000 0"), std::nullopt);
}

TEST(CpuQuotaTest, CgroupV1CfsQuotaGivesTheQuotaInCpus) {
  EXPECT_EQ(CpuQuotaFromCfs("200000\n", "100000\n"), 2.0);
  EXPECT_EQ(CpuQuotaFromCfs("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCfs("x", "100000"), std::nullopt);
}

TEST(CpuQuotaTest, TheV2PathIsTheZeroHierarchyLine) {
  EXPECT_EQ(CgroupV2PathFromProcSelfCgroup("0::/kubepods.slice/pod1/cri-abc\n"), "/kubepods.slice/pod1/cri-abc");
  EXPECT_EQ(CgroupV2PathFromProcSelfCgroup("0::/\n"), "/");
  EXPECT_EQ(CgroupV2PathFromProcSelfCgroup("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n"), std::nullopt);
}

TEST(CpuQuotaTest, TheV1PathIsTheCpuControllersLine) {
  EXPECT_EQ(CgroupV1CpuPathFromProcSelfCgroup("4:memory:/m\n2:cpu,cpuacct:/kubepods/pod1/abc\n0::/\n"),
            "/kubepods/pod1/abc");
  EXPECT_EQ(CgroupV1CpuPathFromProcSelfCgroup("1:cpu:/\n"), "/");
  EXPECT_EQ(CgroupV1CpuPathFromProcSelfCgroup("2:cpuacct:/x\n3:cpuset:/y\n0::/\n"), std::nullopt);
}

TEST(CpuQuotaTest, UsableCpusIsAtLeastOneAndAtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int usable = UsableCpus();
  EXPECT_GE(usable, 1);
  EXPECT_LE(usable, CPU_COUNT(&set));
}

}  // namespace
}  // namespace kvmesh
