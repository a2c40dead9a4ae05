#include "worker/heartbeater.h"

#include <chrono>
#include <vector>

#include "core/logging.h"
#include "engine/engine.h"
#include "rpc/channel.h"
#include "rpc/kv_conversions.h"

namespace kvmesh::worker {

Heartbeater::Heartbeater(WorkerState& state, std::string scheduler, v1::RegisterRequest registration,
                         WorkerHealth* health, int64_t engine_timeout_ms)
    : state_(state),
      health_(health),
      stub_(v1::Scheduler::NewStub(rpc::CreateChannel(scheduler))),
      registration_(std::move(registration)),
      engine_timeout_ms_(engine_timeout_ms) {
  thread_ = std::thread([this] { Loop(); });
}

Heartbeater::~Heartbeater() { Stop(); }

void Heartbeater::SetDraining() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  cv_.notify_all();
}

void Heartbeater::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 2000);
  v1::DeregisterRequest request;
  request.set_worker_id(registration_.worker_id());
  v1::DeregisterResponse response;
  const grpc::Status s = stub_->Deregister(&context, request, &response);
  KVMESH_LOG(kInfo) << "deregistered" << LogKv("ok", s.ok());
}

bool Heartbeater::Register() {
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 2000);
  v1::RegisterResponse response;
  const grpc::Status s = stub_->Register(&context, registration_, &response);
  if (!s.ok()) {
    KVMESH_LOG(kWarning) << "register failed; retrying" << LogKv("status", s.error_message());
    return false;
  }
  if (response.heartbeat_interval_ms() > 0) interval_ms_ = response.heartbeat_interval_ms();
  KVMESH_LOG(kInfo) << "registered with the scheduler" << LogKv("worker_id", registration_.worker_id())
                    << LogKv("heartbeat_ms", interval_ms_);
  if (health_ != nullptr) health_->SetRegistered();
  snapshot_ = true;
  return true;
}

void Heartbeater::Loop() {
  bool registered = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    // NOTE: collected even while unregistered, so that the engine's event queue does
    // not grow while the scheduler is away; Register() asks for a snapshot of stored_.
    const bool collected = CollectEngineState();
    if (!registered) registered = Register();
    if (registered && collected) registered = Beat();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(registered ? interval_ms_ : 1000), [this] { return stopping_; });
  }
}

bool Heartbeater::CollectEngineState() {
  if (!pending_.valid()) {
    auto promise = std::make_shared<std::promise<EngineState>>();
    pending_ = promise->get_future();
    state_.engine().Post([promise](engine::Engine& e) { promise->set_value({e.stats(), e.DrainKvEvents()}); });
  }
  if (pending_.wait_for(std::chrono::milliseconds(engine_timeout_ms_)) != std::future_status::ready) {
    KVMESH_LOG(kWarning) << "the engine did not answer the heartbeat in time; its events wait for the next one"
                         << LogKv("timeout_ms", engine_timeout_ms_);
    return false;
  }
  auto [stats, events] = pending_.get();  // leaves pending_ invalid: the next call posts again
  stats_ = stats;
  for (const kv::KvEvent& event : events) {
    if (event.kind == kv::KvEvent::Kind::kStored) {
      stored_[{event.block_hash, event.tier}] = event;
    } else {
      stored_.erase({event.block_hash, event.tier});
    }
  }
  if (!snapshot_) {
    unsent_.insert(unsent_.end(), events.begin(), events.end());
    // The deltas are only a shortcut: past the size of a snapshot, send the snapshot.
    if (unsent_.size() > stored_.size() + 1024) snapshot_ = true;
  }
  if (snapshot_) unsent_.clear();
  return true;
}

bool Heartbeater::Beat() {
  const engine::EngineStats& stats = stats_;
  v1::HeartbeatRequest request;
  request.set_worker_id(registration_.worker_id());
  v1::WorkerLoad* load = request.mutable_load();
  load->set_num_running_seqs(stats.num_running_seqs + stats.num_receiving_seqs + stats.num_prefilled_seqs);
  load->set_num_waiting_seqs(stats.num_waiting_seqs);
  load->set_kv_blocks_total(stats.num_kv_blocks);
  load->set_kv_blocks_used(stats.num_kv_blocks_used);
  load->set_kv_blocks_free(stats.num_kv_blocks_free);
  load->set_kv_blocks_cached(stats.num_kv_blocks_cached);
  // What the scheduler weighs a lower-tier hit by against recomputing it.
  load->set_kv_host_read_bytes_per_second(stats.host_tier.read_bytes_per_second);
  load->set_kv_disk_read_bytes_per_second(stats.disk_tier.read_bytes_per_second);
  load->set_kv_store_read_bytes_per_second(stats.store_tier.read_bytes_per_second);
  load->set_prefill_tokens_per_second(stats.prefill_tokens_per_second);
  if (snapshot_) {
    request.set_kv_events_snapshot(true);
    for (const auto& [key, event] : stored_) rpc::ToProto(event, request.add_kv_events());
  } else {
    for (const kv::KvEvent& event : unsent_) rpc::ToProto(event, request.add_kv_events());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_draining(draining_);
  }
  grpc::ClientContext context;
  rpc::SetTimeout(&context, 2000);
  v1::HeartbeatResponse response;
  const grpc::Status s = stub_->Heartbeat(&context, request, &response);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return false;  // Register() asks for a snapshot
  if (!s.ok()) {
    // The scheduler may or may not have applied this heartbeat (a timeout does not
    // say): resend everything next time, which is right either way.
    snapshot_ = true;
    unsent_.clear();
    KVMESH_LOG(kWarning) << "heartbeat failed" << LogKv("status", s.error_message());
    return true;
  }
  snapshot_ = false;
  unsent_.clear();
  return true;
}

}  // namespace kvmesh::worker
