#include "comm/tcp_store_client.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "comm/internal/socket_io.h"
#include "core/status_macros.h"

namespace kvmesh::comm {

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& address,
                                                                         absl::Duration connect_timeout,
                                                                         absl::Duration io_timeout) {
  std::string host;
  int port = 0;
  KVMESH_RETURN_IF_ERROR(internal::ParseHostPort(address, &host, &port));
  KVMESH_ASSIGN_OR_RETURN(const int fd, internal::ConnectTcp(host, port, absl::Now() + connect_timeout));
  return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(address, fd, io_timeout));
}

TcpStoreClient::~TcpStoreClient() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) close(fd_);
}

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return absl::UnavailableError(absl::StrCat("TCP store ", address_, ": connection lost"));
  const absl::Time deadline = absl::Now() + io_timeout_;
  absl::Status status = internal::WriteFrame(fd_, {.op = 'S', .key = key, .value = value}, deadline);
  absl::StatusOr<internal::Frame> reply = status.ok() ? internal::ReadFrame(fd_, deadline) : status;
  if (!reply.ok()) {
    close(fd_);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat("TCP store ", address_, ": set ", key, ": ", reply.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return absl::UnavailableError(absl::StrCat("TCP store ", address_, ": connection lost"));
  // The server answers by `timeout`; the grace covers the round trip.
  const absl::Time deadline = absl::Now() + timeout + absl::Seconds(5);
  absl::Status status = internal::WriteFrame(
      fd_, {.op = 'G', .key = key, .value = std::to_string(absl::ToInt64Milliseconds(timeout))}, deadline);
  absl::StatusOr<internal::Frame> reply = status.ok() ? internal::ReadFrame(fd_, deadline) : status;
  if (!reply.ok()) {
    close(fd_);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat("TCP store ", address_, ": get ", key, ": ", reply.status().message()));
  }
  if (reply->op != 'K')
    return absl::DeadlineExceededError(absl::StrCat("TCP store ", address_, ": key \"", key, "\" not set within ",
                                                    absl::FormatDuration(timeout)));
  return std::move(reply->value);
}

}  // namespace kvmesh::comm
