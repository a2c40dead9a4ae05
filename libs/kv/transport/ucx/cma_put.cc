#include "kv/transport/ucx/cma_put.h"

#include <sys/stat.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvmesh::kv {

std::string LocalCmaIdentity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!std::getline(boot, boot_id) || boot_id.empty()) return "";
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) != 0) return "";
  return absl::StrCat(absl::StripAsciiWhitespace(boot_id), "/", ns.st_ino);
}

bool UcxTlsAllowsCma(std::string_view tls) {
  std::string value(tls);
  if (value.empty()) {
    const char* env = std::getenv("UCX_TLS");
    value = env == nullptr ? "" : env;
  }
  if (value.empty()) return true;
  const bool exclude = value[0] == '^';
  if (exclude) value.erase(0, 1);
  bool named = false;
  for (absl::string_view t : absl::StrSplit(value, ',')) {
    t = absl::StripAsciiWhitespace(t);
    if (t == "sm" || t == "shm" || t == "cma" || (!exclude && t == "all")) named = true;
  }
  return exclude ? !named : named;
}

absl::Status CmaWrite(pid_t pid, const std::byte* local, size_t bytes, uint64_t remote) {
  size_t done = 0;
  while (done < bytes) {
    // NOTE: the kernel may write less than asked (a large range): continue after it.
    iovec src{.iov_base = const_cast<std::byte*>(local + done), .iov_len = bytes - done};
    iovec dst{.iov_base = reinterpret_cast<void*>(remote + done), .iov_len = bytes - done};
    const ssize_t n = ::process_vm_writev(pid, &src, 1, &dst, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    const std::string what = absl::StrCat("process_vm_writev to pid ", pid, ": ", std::strerror(err));
    if (err == ESRCH) return absl::UnavailableError(absl::StrCat(what, " (the receiver is gone)"));
    if (err == EPERM || err == ENOSYS) return absl::PermissionDeniedError(what);
    if (err == EFAULT) return absl::InvalidArgumentError(absl::StrCat(what, " (the remote range is not mapped)"));
    return absl::InternalError(what);
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::kv
