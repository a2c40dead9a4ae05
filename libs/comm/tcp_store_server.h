// TcpStoreServer: the rendezvous key-value store of one communicator group, served
// over TCP by the group's rank 0 (or any process every rank can reach), so ranks in
// other processes and on other hosts can meet (TcpStoreClient is the other end).
//
// A GET waits on the server until the key is set or the client's timeout passes, so
// clients do not poll. Values stay until the server stops.
//
// Thread-safety: thread-safe. One thread accepts, one thread serves each connection;
// Stop() (or the destructor) closes every socket and joins them.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvmesh::comm {

struct TcpStoreServerOptions {
  std::string bind_host = "127.0.0.1";  // "0.0.0.0" to serve other hosts
  int port = 0;                         // 0: an ephemeral port (see port())
};

class TcpStoreServer {
 public:
  // Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // "host:port" for TcpStoreClient.
  std::string address() const;
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TcpStoreServer(std::string host, int listen_fd, int port) : host_(std::move(host)), listen_fd_(listen_fd), port_(port) {}
  void AcceptLoop();
  void Serve(int fd);

  const std::string host_;
  const int listen_fd_;
  const int port_;
  std::thread accept_thread_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::vector<int> client_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> client_threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmesh::comm
