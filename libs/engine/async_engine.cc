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

absl::Status AsyncEngine::Submit(EngineRequest request) {
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
    new_requests_.push_back(std::move(request));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void AsyncEngine::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(request_id);
  }
  cv_.notify_one();
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
  for (;;) {
    std::deque<EngineRequest> requests;
    std::vector<std::string> aborts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !new_requests_.empty() || !aborts_.empty() || engine_->HasUnfinishedRequests();
      });
      if (stopping_ && new_requests_.empty() && !engine_->HasUnfinishedRequests()) return;
      requests.swap(new_requests_);
      aborts.swap(aborts_);
    }
    for (EngineRequest& request : requests) {
      const std::string id = request.request_id;
      auto on_output = request.on_output;
      const bool duplicate = live_.contains(id);
      live_.insert(id);
      if (absl::Status s = engine_->AddRequest(std::move(request)); !s.ok()) {
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
    for (const std::string& id : aborts) {
      if (id.empty()) {  // abort everything (drain deadline)
        AbortAllLive();
      } else {
        (void)engine_->Abort(id);  // unknown/finished ids: FailedPrecondition, ignored
      }
    }
    if (engine_->HasUnfinishedRequests()) {
      absl::StatusOr<std::vector<RequestOutput>> outputs = engine_->Step();
      if (!outputs.ok()) {
        KVMESH_LOG(kError) << "engine step failed; aborting all requests: " << outputs.status().ToString();
        AbortAllLive();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = engine_->stats();
  }
}

}  // namespace kvmesh::engine
