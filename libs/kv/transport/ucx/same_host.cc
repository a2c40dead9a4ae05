#include "kv/transport/ucx/same_host.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvmesh::kv {
namespace {

// `tls`, else the environment's UCX_TLS.
std::string EffectiveTls(std::string_view tls) {
  if (!tls.empty()) return std::string(tls);
  const char* env = std::getenv("UCX_TLS");
  return env == nullptr ? "" : env;
}

// Whether the comma list `value` names any of `names`.
// NOTE: absl::string_view, which Debian's Abseil keeps apart from std::string_view.
bool Names(absl::string_view value, std::initializer_list<absl::string_view> names) {
  for (absl::string_view t : absl::StrSplit(value, ',')) {
    t = absl::StripAsciiWhitespace(t);
    for (const absl::string_view n : names) {
      if (t == n) return true;
    }
  }
  return false;
}

}  // namespace

std::string LocalHostIdentity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!std::getline(boot, boot_id) || boot_id.empty()) return "";
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) != 0) return "";
  return absl::StrCat(absl::StripAsciiWhitespace(boot_id), "/", ns.st_ino);
}

bool UcxTlsAllowsCma(std::string_view tls) {
  const std::string value = EffectiveTls(tls);
  if (value.empty()) return true;
  if (value[0] == '^') return !Names(absl::string_view(value).substr(1), {"sm", "shm", "cma"});
  return Names(value, {"all", "sm", "shm", "cma"});
}

bool UcxTlsAllowsSharedMemory(std::string_view tls) {
  const std::string value = EffectiveTls(tls);
  if (value.empty()) return true;
  if (value[0] == '^') {
    const absl::string_view excluded = absl::string_view(value).substr(1);
    return !Names(excluded, {"sm", "shm", "mm"}) && !(Names(excluded, {"posix"}) && Names(excluded, {"sysv"}));
  }
  return Names(value, {"all", "sm", "shm", "mm", "posix", "sysv"});
}

}  // namespace kvmesh::kv
