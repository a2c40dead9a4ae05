// GlooCommunicator: the Communicator of CPU ranks, on Gloo's TCP transport (host
// memory only). The group meets through a Store (TcpStoreClient across processes and
// hosts), then every pair of ranks holds a direct TCP connection.
//
// Gloo reports failures by throwing; this class catches every exception at its edge
// and returns a Status (see communicator.h for the codes). Each collective is bounded
// by `timeout`: a peer that stops participating yields DeadlineExceeded, one whose
// process died yields Unavailable, both without hanging. Create sets SIGPIPE to
// ignored if it still has its default action (Gloo's writes would otherwise kill the
// process when a peer dies).
//
// Thread-safety: not thread-safe (one rank thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace kvmesh::comm {

struct GlooCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  // Keys of this group in the store are prefixed with it: groups sharing a store need
  // distinct names, and a group re-formed after a failure needs a new one.
  std::string group_name = "tp";
  // The address this rank listens on for its peers: "127.0.0.1" for ranks on one
  // host, else this host's address on the network the peers share.
  std::string hostname = "127.0.0.1";
  // Bound on the rendezvous and on every collective.
  absl::Duration timeout = absl::Seconds(30);
};

class GlooCommunicator : public Communicator {
 public:
  // Connects the full mesh. `store` is used only during Create. InvalidArgument for a
  // bad rank/world size; DeadlineExceeded/Unavailable if the peers do not all arrive
  // within the timeout.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(const GlooCommunicatorOptions& options,
                                                                   Store& store);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string_view backend_name() const override { return "gloo"; }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override;
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, DType dtype, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(int rank, int world_size, std::chrono::milliseconds timeout, std::shared_ptr<gloo::Context> context)
      : rank_(rank), world_size_(world_size), timeout_(timeout), context_(std::move(context)) {}
  // Runs one collective: converts exceptions, marks the group broken on failure.
  template <typename Fn>
  absl::Status Run(const char* what, Fn&& fn);

  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;   // every rank issues the same sequence, so tags agree
  absl::Status broken_;     // the first failure; OK while the group is healthy
};

}  // namespace kvmesh::comm
