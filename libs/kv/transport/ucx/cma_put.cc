#include "kv/transport/ucx/cma_put.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvmesh::kv {

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
