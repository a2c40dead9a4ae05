#include "engine/async_engine.h"

#include <chrono>

#include "core/logging.h"

namespace kvmesh::engine {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)), limits_(engine_->limits()), stats_(engine_->stats()) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() {
  Drain(/*deadline_ms=*/0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status AsyncEngine::Submit(EngineRequest request) { return SubmitWith(std::move(request), nullptr); }

absl::Status AsyncEngine::SubmitWith(EngineRequest request, AdmitFn admit) {
  if (absl::Status s = ValidateEngineRequest(request, limits_); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::FailedPreconditionError("the engine is draining and admits no new requests");
    // Count the request as unfinished until its final output has been delivered.
    auto callback = std::move(request.on_output);
    request.on_output = [this, callback = std::move(callback)](const RequestOutput& out) {
      if (callback) callback(out);
      if (out.finished) {
        live_.erase(out.request_id);  // runs on the engine thread, the owner of live_
        std::lock_guard<std::mutex> lock(mu_);
        if (--num_unfinished_ == 0) idle_cv_.notify_all();
      }
    };
    ++num_unfinished_;
    new_requests_.push_back(PendingRequest{std::move(request), std::move(admit)});
    // NOTE: notified under the lock, here and in Post and Abort: a caller on a gRPC
    // thread (a reactor's OnCancel) may be the last to touch this object before the
    // server's shutdown lets the owner destroy it, ordered only by gRPC's own atomics;
    // inside the lock, the destructor's lock of mu_ orders it.
    cv_.notify_one();
  }
  return absl::OkStatus();
}

void AsyncEngine::Post(std::function<void(Engine&)> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    cv_.notify_one();  // under the lock: see SubmitWith
  }
}

void AsyncEngine::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(request_id);
    cv_.notify_one();  // under the lock: see SubmitWith
  }
}

void AsyncEngine::Drain(int64_t deadline_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  idle_cv_.wait_until(lock, deadline, [this] { return num_unfinished_ == 0; });
  if (num_unfinished_ == 0) return;
  KVMESH_LOG(kWarning) << "drain deadline passed; aborting unfinished requests"
                       << LogKv("unfinished", num_unfinished_);
  // The loop aborts everything it holds when it sees an empty-id abort.
  aborts_.push_back("");
  cv_.notify_one();
  idle_cv_.wait(lock, [this] { return num_unfinished_ == 0; });
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AsyncEngine::AbortAllLive() {
  const std::vector<std::string> ids(live_.begin(), live_.end());  // Abort's callback erases
  for (const std::string& id : ids) (void)engine_->Abort(id);
}

void AsyncEngine::Loop() {
  // True when the previous step could run nothing although requests are unfinished:
  // they are all parked (leases, pinned prefills), so wait a little instead of spinning.
  bool parked = false;
  for (;;) {
    std::deque<PendingRequest> requests;
    std::vector<std::string> aborts;
    std::vector<std::function<void(Engine&)>> tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto inbox_ready = [&] { return stopping_ || !new_requests_.empty() || !aborts_.empty() || !tasks_.empty(); };
      if (parked) {
        cv_.wait_for(lock, std::chrono::milliseconds(5), inbox_ready);
      } else {
        cv_.wait(lock, [&] { return inbox_ready() || engine_->HasUnfinishedRequests(); });
      }
      if (stopping_ && new_requests_.empty() && tasks_.empty() && !engine_->HasUnfinishedRequests()) return;
      requests.swap(new_requests_);
      aborts.swap(aborts_);
      tasks.swap(tasks_);
    }
    for (PendingRequest& pending : requests) {
      EngineRequest& request = pending.request;
      const std::string id = request.request_id;
      auto on_output = request.on_output;
      const bool duplicate = live_.contains(id);
      live_.insert(id);
      const absl::Status s =
          pending.admit ? pending.admit(*engine_, std::move(request)) : engine_->AddRequest(std::move(request));
      if (!s.ok()) {
        if (!duplicate) live_.erase(id);
        // Rejected on the loop (e.g. a duplicate id): the caller still gets one final output.
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.status = s;
        on_output(out);  // erases `id` from live_
        if (duplicate) live_.insert(id);  // the earlier request of that id is still running
      }
    }
    for (auto& task : tasks) task(*engine_);
    for (const std::string& id : aborts) {
      if (id.empty()) {  // abort everything (drain deadline)
        AbortAllLive();
      } else {
        (void)engine_->Abort(id);  // unknown/finished ids: FailedPrecondition, ignored
      }
    }
    parked = false;
    if (engine_->HasUnfinishedRequests()) {
      absl::StatusOr<std::vector<RequestOutput>> outputs = engine_->Step();
      if (!outputs.ok()) {
        KVMESH_LOG(kError) << "engine step failed; aborting all requests: " << outputs.status().ToString();
        AbortAllLive();
      } else if (outputs->empty()) {
        const EngineStats s = engine_->stats();
        parked = s.num_running_seqs == 0 && s.num_waiting_seqs == 0 &&
                 s.num_receiving_seqs + s.num_prefilled_seqs > 0;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = engine_->stats();
  }
}

}  // namespace kvmesh::engine
