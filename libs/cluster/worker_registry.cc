#include "cluster/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"

namespace kvmesh::cluster {

WorkerRegistry::WorkerRegistry(const WorkerRegistryOptions& options)
    : options_(options),
      ttl_(absl::Milliseconds(options.worker_ttl_ms)),
      clock_(options.clock != nullptr ? *options.clock : Clock::Real()) {}

std::vector<std::string> WorkerRegistry::ExpireLocked(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [id, state] : workers_) {
    if (now - state.snapshot.last_heartbeat_at > ttl_) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());
  for (const std::string& id : expired) {
    KVMESH_LOG(kWarning) << "worker expired" << LogKv("worker", id)
                         << LogKv("silent_ms", absl::ToInt64Milliseconds(now - workers_[id].snapshot.last_heartbeat_at))
                         << LogKv("ttl_ms", options_.worker_ttl_ms);
    RemoveLocked(id);
  }
  num_expired_total_ += static_cast<int64_t>(expired.size());
  return expired;
}

void WorkerRegistry::RemoveLocked(const std::string& worker_id) {
  index_.RemoveWorker(worker_id);
  in_flight_.RemoveWorker(worker_id);
  workers_.erase(worker_id);
}

WorkerSnapshot WorkerRegistry::SnapshotLocked(const WorkerState& state) const {
  WorkerSnapshot snapshot = state.snapshot;
  snapshot.num_indexed_blocks = index_.num_blocks(snapshot.registration.worker_id);
  return snapshot;
}

absl::Status WorkerRegistry::Register(const WorkerRegistration& registration) {
  KVMESH_RETURN_IF_ERROR(registration.Validate());
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (const auto& [id, state] : workers_) {
    const WorkerRegistration& other = state.snapshot.registration;
    if (id == registration.worker_id || other.model != registration.model) continue;
    // NOTE: tensor-parallel sizes may differ (a TP group serves alone as well as any);
    // placement pairs a prefill and a decode worker only when theirs are equal.
    KvCacheSpec comparable = registration.kv_cache_spec;
    comparable.tp_size = other.kv_cache_spec.tp_size;
    if (!(other.kv_cache_spec == comparable)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", registration.worker_id, ": kv_cache_spec {", registration.kv_cache_spec.DebugString(),
          "} differs from live worker ", id, "'s {", other.kv_cache_spec.DebugString(), "} for model ",
          registration.model));
    }
  }
  if (workers_.contains(registration.worker_id)) {
    // A restart (or a retried Register): its old blocks are gone or will be re-sent.
    index_.RemoveWorker(registration.worker_id);
    in_flight_.RemoveWorker(registration.worker_id);
  }
  WorkerState& state = workers_[registration.worker_id];
  state.snapshot = WorkerSnapshot{};
  state.snapshot.registration = registration;
  state.snapshot.registered_at = now;
  state.snapshot.last_heartbeat_at = now;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Heartbeat(std::string_view worker_id, const HeartbeatReport& report) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = workers_.find(ToAbsl(worker_id));
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", ToAbsl(worker_id), " is not registered (or its lease expired): Register again"));
  }
  WorkerSnapshot& snapshot = it->second.snapshot;
  snapshot.load = report.load;
  snapshot.last_heartbeat_at = now;
  snapshot.draining = report.draining;
  snapshot.num_recent_placements = 0;
  if (report.kv_events_snapshot) index_.RemoveWorker(worker_id);
  index_.Apply(worker_id, report.kv_events);
  in_flight_.Apply(worker_id, report.kv_events, now);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Deregister(std::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(ToAbsl(worker_id));
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("worker ", ToAbsl(worker_id), " is not registered"));
  RemoveLocked(it->first);
  return absl::OkStatus();
}

std::vector<std::string> WorkerRegistry::ExpireStale() {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  return ExpireLocked(now);
}

std::vector<kv::KvEvent> WorkerRegistry::IndexedBlocks(std::string_view worker_id, int64_t max_blocks) {
  absl::MutexLock lock(&mu_);
  return index_.WorkerBlocks(worker_id, max_blocks);
}

std::vector<WorkerSnapshot> WorkerRegistry::List(std::string_view model) {
  const absl::Time now = clock_.Now();
  std::vector<WorkerSnapshot> result;
  {
    absl::MutexLock lock(&mu_);
    ExpireLocked(now);
    for (const auto& [id, state] : workers_) {
      if (!model.empty() && state.snapshot.registration.model != model) continue;
      result.push_back(SnapshotLocked(state));
    }
  }
  std::sort(result.begin(), result.end(), [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
    return a.registration.worker_id < b.registration.worker_id;
  });
  return result;
}

absl::StatusOr<KvCacheSpec> WorkerRegistry::ModelKvCacheSpec(std::string_view model) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (const auto& [id, state] : workers_) {
    if (state.snapshot.registration.model == model) return state.snapshot.registration.kv_cache_spec;
  }
  return absl::UnavailableError(absl::StrCat("no live worker serves model \"", ToAbsl(model), "\""));
}

std::vector<WorkerCandidate> WorkerRegistry::Candidates(std::string_view model,
                                                        std::span<const kv::BlockHash> prompt_hashes,
                                                        std::span<const std::string> exclude_worker_ids) {
  const absl::Time now = clock_.Now();
  std::vector<WorkerCandidate> result;
  {
    absl::MutexLock lock(&mu_);
    ExpireLocked(now);
    const absl::flat_hash_map<std::string, PrefixMatch> matches = index_.Match(prompt_hashes);
    StoreResidency::Matcher stored_blocks(store_, prompt_hashes);
    for (const auto& [id, state] : workers_) {
      if (state.snapshot.registration.model != model || state.snapshot.draining) continue;
      if (state.snapshot.unreachable_until > now) continue;
      if (std::find(exclude_worker_ids.begin(), exclude_worker_ids.end(), id) != exclude_worker_ids.end()) continue;
      WorkerCandidate candidate{.worker = SnapshotLocked(state), .prefix = {}};
      if (auto m = matches.find(id); m != matches.end()) candidate.prefix = m->second;
      const int32_t in_flight =
          in_flight_.LeadingRun(id, prompt_hashes, static_cast<size_t>(candidate.prefix.num_blocks), now);
      candidate.prefix.num_blocks += in_flight;
      candidate.prefix.num_blocks_in_flight = in_flight;
      // What it would load from a store rather than recompute, after all of that.
      const int32_t stored = stored_blocks.LeadingRun(state.snapshot.registration.kv_store_key_spaces,
                                                      static_cast<size_t>(candidate.prefix.num_blocks));
      candidate.prefix.num_blocks += stored;
      candidate.prefix.num_blocks_by_tier[static_cast<int>(kv::Tier::kStore)] += stored;
      result.push_back(std::move(candidate));
    }
  }
  std::sort(result.begin(), result.end(), [](const WorkerCandidate& a, const WorkerCandidate& b) {
    return a.worker.registration.worker_id < b.worker.registration.worker_id;
  });
  return result;
}

absl::StatusOr<std::string> WorkerRegistry::ReportUnreachable(std::string_view worker_id, std::string_view address) {
  if (worker_id.empty() && address.empty()) {
    return absl::InvalidArgumentError("ReportUnreachable needs the worker's id or address");
  }
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (auto& [id, state] : workers_) {
    const bool match = !worker_id.empty() ? id == worker_id : state.snapshot.registration.address == address;
    if (!match) continue;
    state.snapshot.unreachable_until = now + absl::Milliseconds(options_.unreachable_ttl_ms);
    return id;
  }
  return absl::NotFoundError(absl::StrCat("no live worker ", worker_id.empty() ? "at " : "", ToAbsl(worker_id.empty() ? address : worker_id)));
}

void WorkerRegistry::NotePlacement(std::string_view worker_id, std::span<const kv::BlockHash> prompt_hashes) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(ToAbsl(worker_id));
  if (it == workers_.end()) return;
  ++it->second.snapshot.num_recent_placements;
  if (options_.in_flight_prefix_ttl_ms <= 0 || prompt_hashes.empty()) return;
  // What the worker holds already is not in flight: its eviction must show at once.
  const auto held = static_cast<size_t>(index_.MatchWorker(prompt_hashes, worker_id).num_blocks);
  if (held < prompt_hashes.size()) {
    in_flight_.Note(worker_id, prompt_hashes.subspan(held), now + absl::Milliseconds(options_.in_flight_prefix_ttl_ms));
  }
}

bool WorkerRegistry::ApplyStoreEvents(std::string_view address, const kv_store::StoreEventsPage& page) {
  absl::MutexLock lock(&mu_);
  return store_.Apply(address, page);
}

void WorkerRegistry::ForgetStore(std::string_view address) {
  absl::MutexLock lock(&mu_);
  store_.Forget(address);
}

int64_t WorkerRegistry::num_store_blocks(std::string_view address) const {
  absl::MutexLock lock(&mu_);
  return store_.num_blocks(address);
}

int32_t WorkerRegistry::num_workers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(workers_.size());
}

RegistryStats WorkerRegistry::stats() const {
  absl::MutexLock lock(&mu_);
  RegistryStats stats;
  for (const auto& [id, state] : workers_) {
    switch (state.snapshot.registration.role) {
      case WorkerRole::kPrefill: ++stats.num_prefill_workers; break;
      case WorkerRole::kDecode: ++stats.num_decode_workers; break;
      case WorkerRole::kBoth: ++stats.num_both_workers; break;
    }
    if (state.snapshot.draining) ++stats.num_draining_workers;
  }
  stats.num_indexed_hashes = index_.num_hashes();
  stats.num_store_keys = store_.num_keys();
  stats.num_expired_total = num_expired_total_;
  return stats;
}

}  // namespace kvmesh::cluster
