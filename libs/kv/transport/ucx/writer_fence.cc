#include "kv/transport/ucx/writer_fence.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace kvmesh::kv {

WriterProcess WriterProcess::Open(pid_t pid) {
  if (pid <= 0) return WriterProcess(0, -1);
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  const int fd = -1;
#endif
  // NOTE: a pid that is already gone (ESRCH) keeps no fd; Gone() then asks kill(), which
  // says so too (or, if the pid was reused meanwhile, keeps the fence: never unsafe).
  return WriterProcess(pid, fd);
}

WriterProcess::WriterProcess(WriterProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, 0)), pidfd_(std::exchange(other.pidfd_, -1)) {}

WriterProcess& WriterProcess::operator=(WriterProcess&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) ::close(pidfd_);
    pid_ = std::exchange(other.pid_, 0);
    pidfd_ = std::exchange(other.pidfd_, -1);
  }
  return *this;
}

WriterProcess::~WriterProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool WriterProcess::Gone() const {
  if (pid_ <= 0) return false;
  if (pidfd_ >= 0) {
    // A pidfd polls readable once its process has exited (zombie or reaped).
    pollfd p{.fd = pidfd_, .events = POLLIN, .revents = 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
  }
  return ::kill(pid_, 0) != 0 && errno == ESRCH;
}

void WriterFences::Add(uint64_t lease_token, uint64_t push_id, WriterProcess writer, std::function<void()> on_released) {
  fences_.insert_or_assign(lease_token,
                           Fence{.push_id = push_id, .writer = std::move(writer), .on_released = std::move(on_released)});
}

std::optional<std::function<void()>> WriterFences::Acknowledge(uint64_t lease_token, uint64_t push_id) {
  const auto it = fences_.find(lease_token);
  if (it == fences_.end() || it->second.push_id != push_id) return std::nullopt;
  std::function<void()> released = std::move(it->second.on_released);
  fences_.erase(it);
  return released;
}

std::vector<std::function<void()>> WriterFences::ReleaseGone() {
  std::vector<std::function<void()>> released;
  for (auto it = fences_.begin(); it != fences_.end();) {
    if (it->second.writer.Gone()) {
      released.push_back(std::move(it->second.on_released));
      fences_.erase(it++);
    } else {
      ++it;
    }
  }
  return released;
}

}  // namespace kvmesh::kv
