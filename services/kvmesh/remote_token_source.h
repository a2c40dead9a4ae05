// RemoteTokenSource: the router's token source (serving::TokenSource) over the cluster.
// Each request asks the scheduler where to run (Scheduler.Place), then streams its
// tokens from the chosen decode worker (Worker.Generate, naming the chosen prefill
// worker) and turns the stream into engine::RequestOutputs, the last one final:
// finished with the worker's status when the stream fails (UNAVAILABLE when no
// worker serves the model or a worker died), with "abort" after Abort().
//
// Thread-safety: thread-safe. Outputs are delivered on gRPC threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "serving/token_source.h"

namespace kvmesh::cli {

struct RemoteTokenSourceOptions {
  std::string scheduler_address;  // host:port
  std::string model;              // as workers register it
  engine::RequestLimits limits;   // what Submit validates against
  int64_t place_timeout_ms = 5'000;
  int64_t generate_timeout_ms = 600'000;
};

class RemoteTokenSource final : public serving::TokenSource {
 public:
  explicit RemoteTokenSource(RemoteTokenSourceOptions options);
  // Cancels what is in flight and waits until every request had its final output.
  ~RemoteTokenSource() override;
  RemoteTokenSource(const RemoteTokenSource&) = delete;
  RemoteTokenSource& operator=(const RemoteTokenSource&) = delete;

  absl::Status Submit(engine::EngineRequest request) override;
  void Abort(const std::string& request_id) override;
  const engine::RequestLimits& limits() const override { return options_.limits; }

  // Requests whose final output has not been delivered.
  int64_t num_inflight() const;
  // Blocks until num_inflight() == 0 or `timeout_ms` passed; true when idle.
  bool WaitIdle(int64_t timeout_ms);

 private:
  class Call;
  friend class Call;

  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  void Forget(const std::string& request_id);

  const RemoteTokenSourceOptions options_;
  std::unique_ptr<v1::Scheduler::Stub> scheduler_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_;  // guarded by mu_
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
};

}  // namespace kvmesh::cli
