// How many CPUs this process can keep busy: its affinity mask, capped by its cgroup's
// CPU quota (Kubernetes limits.cpu), rounded up. The CPU backend sizes its kernel
// threads from it by default: OpenMP's own default is the affinity mask alone, which in
// a pod limited to 4 CPUs on a 64-core node starts 64 spinning threads that use up the
// quota within a few milliseconds of each 100 ms period and then sit throttled.
#pragma once

#include <optional>
#include <string>

namespace kvmesh {

// max(1, min(affinity CPUs, ceil(cgroup quota))). Without a quota (or where the cgroup
// files cannot be read), the affinity CPUs.
int UsableCpus();

// cgroup v2 cpu.max ("max 100000" or "400000 100000"): the quota in CPUs; nullopt when
// unlimited or malformed.
std::optional<double> CpuQuotaFromCpuMax(const std::string& cpu_max);

// cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us (quota -1: unlimited): the quota in CPUs;
// nullopt when unlimited or malformed.
std::optional<double> CpuQuotaFromCfs(const std::string& quota_us, const std::string& period_us);

// The cgroup v2 path of this process from /proc/self/cgroup's "0::<path>" line; nullopt
// without one (cgroup v1 only).
std::optional<std::string> CgroupV2PathFromProcSelfCgroup(const std::string& proc_self_cgroup);

// The cgroup v1 path of this process in the hierarchy with the cpu controller
// ("N:cpu,cpuacct:<path>"); nullopt without one.
std::optional<std::string> CgroupV1CpuPathFromProcSelfCgroup(const std::string& proc_self_cgroup);

}  // namespace kvmesh
