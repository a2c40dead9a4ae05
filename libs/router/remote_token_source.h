// RemoteTokenSource: the router's token source (serving::TokenSource) over the cluster.
// Each request asks the scheduler where to run (Scheduler.Place), then streams its
// tokens from the chosen decode worker (Worker.Generate, naming the chosen prefill
// worker) and turns the stream into engine::RequestOutputs, the last one final:
// finished with the worker's status when the stream fails (UNAVAILABLE when no
// worker serves the model or a worker died), with "abort" after Abort().
//
// Retry. When the chosen decode worker fails the call UNAVAILABLE — it cannot be
// reached (refused, reset: the worker died and the scheduler has not expired it yet;
// then the scheduler is told, Scheduler.ReportUnreachable) or says it cannot serve
// now — or a draining worker hands the request back (ABORTED), the request is placed
// again with that worker excluded, up to max_attempts placements in all.
// Migration. When that happens after tokens streamed (they reached the client), the
// next decode worker resumes from them (WorkerGenerateRequest.resume_output_token_ids:
// it prefills prompt + those tokens, a seeded sampler skips their draws) and the
// stream goes on with no token repeated or missing. Only for n == 1 and an unfinished
// sample; otherwise the request fails with the worker's status, named. Other errors
// (bad input, an engine error) are not retried.
//
// Scheduler unreachable. When Place() fails because the scheduler is down or hung
// (FallbackPlacer::ShouldFallBack), the request is placed by the router itself from
// the last worker view the scheduler gave it (FallbackPlacer), and then streams as
// usual: the control plane is off the token path.
//
// Thread-safety: thread-safe. Outputs are delivered on gRPC threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"
#include "kvmesh/v1/worker.grpc.pb.h"
#include "router/fallback_placer.h"
#include "router/router_metrics.h"
#include "serving/token_source.h"

namespace kvmesh::router {

struct RemoteTokenSourceOptions {
  std::string scheduler_address;  // host:port
  std::string model;              // as workers register it
  engine::RequestLimits limits;   // what Submit validates against
  int64_t place_timeout_ms = 5'000;
  int64_t generate_timeout_ms = 600'000;
  // Placements per request, the first included (>= 1): an unreachable decode worker
  // costs one.
  int32_t max_attempts = 3;
  // How often the worker view for placing without the scheduler is refreshed
  // (FallbackPlacer); 0: no fallback, a Place() failure fails the request.
  int64_t placement_view_refresh_ms = 1'000;
};

class RemoteTokenSource final : public serving::TokenSource {
 public:
  // `metrics` may be null; otherwise it must outlive this.
  explicit RemoteTokenSource(RemoteTokenSourceOptions options, RouterMetrics* metrics = nullptr);
  // Cancels what is in flight and waits until every request had its final output.
  ~RemoteTokenSource() override;
  RemoteTokenSource(const RemoteTokenSource&) = delete;
  RemoteTokenSource& operator=(const RemoteTokenSource&) = delete;

  // InvalidArgument (engine::ValidateEngineRequest), AlreadyExists for a running
  // request id, Unavailable once draining.
  absl::Status Submit(engine::EngineRequest request) override;
  void Abort(const std::string& request_id) override;
  const engine::RequestLimits& limits() const override { return options_.limits; }

  // New requests are refused (Unavailable) from now on; running ones continue.
  void StartDraining() { draining_.store(true); }

  // The fallback placer (null when off), for tests and metrics.
  const FallbackPlacer* fallback() const { return fallback_.get(); }
  // Requests placed by the router itself because the scheduler was unreachable.
  int64_t num_fallback_placements() const { return num_fallback_placements_.load(); }

  // Requests whose final output has not been delivered.
  int64_t num_inflight() const;
  // Blocks until num_inflight() == 0 or `timeout_ms` passed; true when idle.
  bool WaitIdle(int64_t timeout_ms);
  // Logs (warning) where each in-flight call stands: for a drain that outlived its
  // deadline, which stage held it.
  void LogInflight() const;

 private:
  class Call;
  class Stream;

  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  // Tells the scheduler a decode worker could not be reached (fire and forget).
  void ReportUnreachable(const std::string& worker_id, std::string_view reason);
  void Forget(const std::string& request_id);

  const RemoteTokenSourceOptions options_;
  RouterMetrics* const metrics_;
  std::shared_ptr<grpc::Channel> scheduler_channel_;
  std::unique_ptr<v1::Scheduler::Stub> scheduler_;
  std::unique_ptr<FallbackPlacer> fallback_;  // null when off
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> num_fallback_placements_{0};
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  // ReportUnreachable calls still in flight (guarded by mu_): the destructor waits for
  // them, since a call outliving its stub and channel breaks gRPC at exit.
  int32_t pending_reports_ = 0;
  // Calls not yet destroyed (guarded by mu_): a call leaves calls_ at its final output
  // but a gRPC thread may hold it, its streams and their contexts a while longer.
  int64_t live_calls_ = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_;  // guarded by mu_
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // guarded by mu_
};

}  // namespace kvmesh::router
