#include "core/cpu_quota.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"

namespace kvmesh {
namespace {

std::optional<double> Quota(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<double>(quota) / static_cast<double>(period);
}

std::optional<std::string> Read(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

// The quota this process runs under, if any: cgroup v2 (its own cgroup, as the cgroup
// namespace of a container shows it, then the mount's root), else cgroup v1.
std::optional<double> CgroupCpuQuota() {
  const std::string self = Read("/proc/self/cgroup").value_or("");
  if (std::optional<std::string> path = CgroupV2PathFromProcSelfCgroup(self); path.has_value()) {
    for (const std::string& dir : {"/sys/fs/cgroup" + *path, std::string("/sys/fs/cgroup")}) {
      if (std::optional<std::string> max = Read(dir + "/cpu.max"); max.has_value()) return CpuQuotaFromCpuMax(*max);
    }
  }
  const std::string v1 = CgroupV1CpuPathFromProcSelfCgroup(self).value_or("/");
  for (const char* mount : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    // Its own cgroup (a container's namespace shows it as "/"), then the mount's root.
    for (const std::string& dir : {mount + v1, std::string(mount)}) {
      std::optional<std::string> quota = Read(dir + "/cpu.cfs_quota_us");
      std::optional<std::string> period = Read(dir + "/cpu.cfs_period_us");
      if (quota.has_value() && period.has_value()) return CpuQuotaFromCfs(*quota, *period);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> CpuQuotaFromCpuMax(const std::string& cpu_max) {
  const std::vector<std::string> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  if (!absl::SimpleAtoi(parts[0], &quota) || !absl::SimpleAtoi(parts[1], &period)) return std::nullopt;
  return Quota(quota, period);
}

std::optional<double> CpuQuotaFromCfs(const std::string& quota_us, const std::string& period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period)) {
    return std::nullopt;
  }
  return Quota(quota, period);
}

std::optional<std::string> CgroupV2PathFromProcSelfCgroup(const std::string& proc_self_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) return std::string(absl::StripTrailingAsciiWhitespace(line));
  }
  return std::nullopt;
}

std::optional<std::string> CgroupV1CpuPathFromProcSelfCgroup(const std::string& proc_self_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "cpu") return std::string(absl::StripTrailingAsciiWhitespace(fields[2]));
    }
  }
  return std::nullopt;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  if (std::optional<double> quota = CgroupCpuQuota(); quota.has_value()) {
    cpus = std::min(cpus, static_cast<int>(std::ceil(*quota - 1e-9)));
  }
  return std::max(cpus, 1);
}

}  // namespace kvmesh
