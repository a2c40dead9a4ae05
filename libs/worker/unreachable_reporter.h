// UnreachableReporter: tells the scheduler (Scheduler.ReportUnreachable) that this
// worker could not reach a peer — a prefill worker that refused, reset or stopped
// answering keepalives mid-Prefill — so placement stops choosing it at once instead of
// when its heartbeats expire. Fire and forget: a report that fails is only logged (the
// heartbeat expiry still covers a dead peer). One report per address per
// min_interval_ms, so a burst of failures toward one peer costs one call.
//
// Thread-safety: thread-safe; Report never blocks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "kvmesh/v1/scheduler.grpc.pb.h"

namespace kvmesh::worker {

struct UnreachableReporterOptions {
  std::string scheduler_address;  // host:port
  std::string reporter;           // this worker's id, for the scheduler's logs
  int64_t min_interval_ms = 1000;
  int64_t timeout_ms = 2000;
};

class UnreachableReporter {
 public:
  explicit UnreachableReporter(UnreachableReporterOptions options);
  // Waits for the reports in flight (each bounded by timeout_ms): a call outliving its
  // stub and channel breaks gRPC at exit.
  ~UnreachableReporter();

  // Reports `address` (unless reported within min_interval_ms).
  void Report(const std::string& address, const std::string& reason);

 private:
  const UnreachableReporterOptions options_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::chrono::steady_clock::time_point> last_report_;  // guarded by mu_
  int32_t in_flight_ = 0;  // guarded by mu_
  std::condition_variable idle_;
};

}  // namespace kvmesh::worker
