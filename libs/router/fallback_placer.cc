#include "router/fallback_placer.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"
#include "rpc/channel.h"
#include "rpc/kv_conversions.h"
#include "rpc/status_conversion.h"
#include "cluster_rpc/cluster_conversions.h"

namespace kvmesh::router {
namespace {

// The view never expires by itself: it is replaced by the next good refresh, and a
// stale view is what the router falls back to on purpose (1. in the header).
constexpr int64_t kViewTtlMs = int64_t{10} * 365 * 24 * 3600 * 1000;

absl::StatusOr<cluster::WorkerRegistration> RegistrationFromStatus(const v1::WorkerStatus& w) {
  cluster::WorkerRegistration r;
  r.worker_id = w.worker_id();
  r.address = w.address();
  KVMESH_ASSIGN_OR_RETURN(r.role, cluster_rpc::WorkerRoleFromProto(w.role()));
  r.model = w.model();
  KVMESH_ASSIGN_OR_RETURN(r.kv_cache_spec, cluster_rpc::KvCacheSpecFromProto(w.kv_cache_spec()));
  r.capacity = cluster::WorkerCapacity{.max_num_seqs = w.capacity().max_num_seqs(),
                                       .max_num_batched_tokens = w.capacity().max_num_batched_tokens(),
                                       .max_model_len = w.capacity().max_model_len()};
  return r;
}

}  // namespace

FallbackPlacer::FallbackPlacer(FallbackPlacerOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), policy_(options_.placement) {
  if (channel) stub_ = v1::Scheduler::NewStub(channel);
  if (stub_ && options_.refresh_interval_ms > 0) thread_ = std::thread([this] { Loop(); });
}

FallbackPlacer::~FallbackPlacer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool FallbackPlacer::ShouldFallBack(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

absl::Status FallbackPlacer::Update(const v1::ListWorkersResponse& workers) {
  auto registry = std::make_shared<cluster::WorkerRegistry>(
      cluster::WorkerRegistryOptions{.worker_ttl_ms = kViewTtlMs});
  bool has_decode = false;
  for (const v1::WorkerStatus& w : workers.workers()) {
    if (!options_.model.empty() && w.model() != options_.model) continue;
    has_decode = has_decode || w.role() == v1::WORKER_ROLE_DECODE || w.role() == v1::WORKER_ROLE_BOTH;
    auto registration = RegistrationFromStatus(w);
    if (!registration.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker '", w.worker_id(), "' in the scheduler's view: ", registration.status().message()));
    }
    KVMESH_RETURN_IF_ERROR(registry->Register(*registration));
    cluster::HeartbeatReport report;
    report.load = cluster_rpc::WorkerLoadFromProto(w.load());
    report.draining = w.draining();
    report.kv_events_snapshot = true;
    report.kv_events.reserve(static_cast<size_t>(w.indexed_blocks_size()));
    for (const v1::KvEvent& e : w.indexed_blocks()) {
      KVMESH_ASSIGN_OR_RETURN(kv::KvEvent event, rpc::FromProto(e));
      report.kv_events.push_back(event);
    }
    KVMESH_RETURN_IF_ERROR(registry->Heartbeat(w.worker_id(), report));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++num_updates_;
  if (!has_decode && view_has_decode_) return absl::OkStatus();  // 2. in the header: kept
  registry_ = std::move(registry);
  view_has_decode_ = has_decode;
  return absl::OkStatus();
}

absl::StatusOr<v1::PlaceResponse> FallbackPlacer::Place(const v1::PlaceRequest& request) {
  std::shared_ptr<cluster::WorkerRegistry> registry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registry = registry_;
  }
  if (!registry) {
    return absl::UnavailableError("the scheduler is unreachable and the router has no view of the workers yet");
  }
  cluster::PlacementRequest placement_request = cluster_rpc::PlacementRequestFromProto(request);
  KVMESH_ASSIGN_OR_RETURN(cluster::Placement placement, policy_.Place(placement_request, *registry));
  placement.reason = absl::StrCat("router fallback (scheduler unreachable): ", placement.reason);
  v1::PlaceResponse response;
  cluster_rpc::PlacementToProto(placement, &response);
  return response;
}

int32_t FallbackPlacer::num_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_ ? registry_->num_workers() : 0;
}

int64_t FallbackPlacer::num_updates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_updates_;
}

absl::Status FallbackPlacer::Refresh() {
  v1::ListWorkersRequest request;
  request.set_model(options_.model);
  request.set_max_indexed_blocks_per_worker(options_.max_indexed_blocks_per_worker);
  v1::ListWorkersResponse response;
  grpc::ClientContext context;
  rpc::SetTimeout(&context, options_.list_timeout_ms);
  const grpc::Status status = stub_->ListWorkers(&context, request, &response);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return Update(response);
}

void FallbackPlacer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    const absl::Status status = Refresh();
    // Logged on transitions only: a scheduler that is down for minutes is one line.
    if (!status.ok() && !last_refresh_failed_) {
      KVMESH_LOG(kWarning) << "cannot refresh the worker view from the scheduler; placing from the last one "
                              "if the scheduler stays unreachable"
                           << LogKv("error", status.message()) << LogKv("workers", num_workers());
    } else if (status.ok() && last_refresh_failed_) {
      KVMESH_LOG(kInfo) << "worker view refreshed from the scheduler again" << LogKv("workers", num_workers());
    }
    last_refresh_failed_ = !status.ok();
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.refresh_interval_ms), [this] { return stopping_; });
  }
}

}  // namespace kvmesh::router
