// TcpStoreClient: a Store backed by a TcpStoreServer at "host:port", for ranks in any
// process on any host. One connection, opened at Connect and reused; requests are
// serialized on it.
//
// Every call has a deadline: Get waits at most its timeout (plus a short grace for the
// reply), Set at most the client's io timeout, so a dead server yields an error, not a hang.
//
// Thread-safety: thread-safe (one request at a time on the connection).
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "comm/store.h"

namespace kvmesh::comm {

class TcpStoreClient : public Store {
 public:
  // Retries the connection until `connect_timeout` (the server may start later).
  // InvalidArgument for a malformed address; DeadlineExceeded if nothing answers.
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& address,
                                                                 absl::Duration connect_timeout,
                                                                 absl::Duration io_timeout = absl::Seconds(30));
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  absl::Status Set(const std::string& key, const std::string& value) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TcpStoreClient(std::string address, int fd, absl::Duration io_timeout)
      : address_(std::move(address)), fd_(fd), io_timeout_(io_timeout) {}

  const std::string address_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);  // -1 once the connection failed
  const absl::Duration io_timeout_;
};

}  // namespace kvmesh::comm
