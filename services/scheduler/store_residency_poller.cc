#include "store_residency_poller.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status_macros.h"

namespace kvmesh::scheduler {

absl::StatusOr<std::unique_ptr<StoreResidencyPoller>> StoreResidencyPoller::Create(
    StoreResidencyPollerOptions options, cluster::WorkerRegistry& registry, metrics::Registry& metrics) {
  if (options.poll_interval_ms <= 0 || options.timeout_ms <= 0 || options.forget_after_ms <= 0 ||
      options.max_pages_per_round <= 0) {
    return absl::InvalidArgumentError(
        "kv-store residency: the poll interval, call timeout, patience and page budget must be positive");
  }
  absl::flat_hash_set<std::string> seen;
  std::vector<Store> stores;
  for (const std::string& address : options.addresses) {
    if (!seen.insert(address).second) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-store names ", address, " twice"));
    }
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv_store::StoreEventsReader> reader,
                            kv_store::StoreEventsReader::Create({.address = address,
                                                                 .api_key = options.api_key,
                                                                 .timeout_ms = options.timeout_ms}));
    stores.push_back(Store{.reader = std::move(reader)});
  }
  KVMESH_ASSIGN_OR_RETURN(
      metrics::Counter * resets,
      metrics.AddCounter("kvmesh_scheduler_kv_store_resets_total",
                         "Times the mirror of a kv-store started over from a snapshot (a new epoch: the store "
                         "restarted; or the mirror fell behind its journal)."));
  KVMESH_ASSIGN_OR_RETURN(
      metrics::Counter * forgotten,
      metrics.AddCounter("kvmesh_scheduler_kv_store_forgotten_total",
                         "Times a kv-store that could not be read was forgotten (its blocks count as misses)."));
  return std::unique_ptr<StoreResidencyPoller>(
      new StoreResidencyPoller(std::move(options), registry, std::move(stores), resets, forgotten));
}

StoreResidencyPoller::StoreResidencyPoller(StoreResidencyPollerOptions options, cluster::WorkerRegistry& registry,
                                           std::vector<Store> stores, metrics::Counter* resets,
                                           metrics::Counter* forgotten)
    : options_(std::move(options)),
      registry_(registry),
      stores_(std::move(stores)),
      resets_(resets),
      forgotten_(forgotten) {}

StoreResidencyPoller::~StoreResidencyPoller() { Stop(); }

void StoreResidencyPoller::Start() {
  if (stores_.empty() || thread_.joinable()) return;
  thread_ = std::thread([this] {
    const absl::Duration period = absl::Milliseconds(options_.poll_interval_ms);
    do {
      PollOnce();
    } while (!stop_.WaitForNotificationWithTimeout(period));
  });
}

void StoreResidencyPoller::Stop() {
  if (!thread_.joinable()) return;
  stop_.Notify();
  thread_.join();
}

void StoreResidencyPoller::PollOnce() {
  for (Store& store : stores_) Poll(store, absl::Now());
}

void StoreResidencyPoller::Poll(Store& store, absl::Time now) {
  for (int32_t page_number = 0; page_number < options_.max_pages_per_round; ++page_number) {
    absl::StatusOr<kv_store::StoreEventsPage> page = store.reader->Next();
    if (!page.ok()) {
      if (store.known && now - store.last_ok >= absl::Milliseconds(options_.forget_after_ms)) {
        KVMESH_LOG(kWarning) << "kv-store unreadable; placement forgets its blocks"
                             << LogKv("store", store.reader->address()) << LogKv("status", page.status().ToString());
        registry_.ForgetStore(store.reader->address());
        store.reader->Reset();
        store.known = false;
        forgotten_->Increment();
      }
      return;
    }
    store.last_ok = now;
    const bool had_epoch = store.known;
    if (registry_.ApplyStoreEvents(store.reader->address(), *page)) {
      resets_->Increment();
      if (had_epoch) {
        KVMESH_LOG(kInfo) << "kv-store mirror started over" << LogKv("store", store.reader->address())
                          << LogKv("epoch", page->epoch);
      }
    }
    store.known = true;
    const bool more = page->next.snapshot_cursor > 0 || page->events.size() >= store.reader->max_events();
    if (!more) return;
  }
}

}  // namespace kvmesh::scheduler
