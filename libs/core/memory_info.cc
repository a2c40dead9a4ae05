#include "core/memory_info.h"

#include <sstream>

#include "core/file_util.h"

namespace kvmesh {

absl::StatusOr<int64_t> ParseMemAvailableBytes(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // the kernel reports kB
  }
  return absl::InvalidArgumentError("/proc/meminfo has no MemAvailable line");
}

absl::StatusOr<int64_t> AvailableHostMemoryBytes() {
  absl::StatusOr<std::string> text = ReadFileToString("/proc/meminfo");
  if (!text.ok()) return absl::UnavailableError(std::string(text.status().message()));
  return ParseMemAvailableBytes(*text);
}

}  // namespace kvmesh
