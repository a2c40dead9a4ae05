// KvStoreConnector: the cluster kv-store (services/kv_store, through KvStoreClient) as a
// KvConnector below a worker's host tier (kv/kv_connector.h), asked after the disk
// tier. What it does for the engine, which never waits on the network:
//
//   Match     answers from what lookups told it (each answer believed for
//             believe_ms); a block it knows nothing of starts one asynchronous lookup of
//             the rest of the chain and answers `pending` until that lookup returns or
//             its deadline passes (a miss): so `pending` always ends.
//   StartLoad queues the block; the load thread fetches each run of consecutive blocks
//             with one Lookup (a fresh lease) and one Get, which verifies every block
//             against its checksum before it counts as loaded. A block that did not
//             arrive verified — store dead, hung, restarted (a new epoch), evicted,
//             corrupt — completes with an error and is recomputed.
//   StartSave queues the block; the save thread puts what is queued in one call
//             (PutIntent + Put per home store), soon after and off the step. A block it
//             knows the store holds is not saved again.
//
// A store that restarted (KvStoreClient saw a new epoch) held nothing of what was
// believed: the connector forgets every answer it believed (of every store: a forgotten
// answer only costs a lookup), and an answer or a save that came back while a restart
// was being seen is not believed, since it may be the old epoch's. So a block is never
// taken for held, or skipped as saved, on the word of a store that is gone;
// stats().peer_restarts counts the restarts seen.
//
// Every call to a store is bounded by its deadline, so a dead or hung store costs at
// most that long of a request's wait (lookup_timeout_ms before a recompute) and never
// fails a request. Keys: StoreKeySpace over the worker's scope (model, block layout, TP
// rank and degree), so rank r reads and writes rank r's shard; the request's cache_salt
// is folded into the chained block hash itself.
//
// Thread-safety: the KvConnector calls come from the engine thread; a lookup thread, a
// load thread and a save thread make the store calls (three, so a slow save never
// delays a lookup that a request waits for). State they share is guarded by mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kv/busy_bandwidth.h"
#include "kv/kv_connector.h"
#include "kv_store/kv_store_client.h"
#include "kv_store/store_key.h"

namespace kvmesh::kv_store {

struct KvStoreConnectorOptions {
  StoreKeyScope scope;
  int64_t block_bytes = 0;          // one host slot: every layer of one block (this rank's)
  int64_t lookup_timeout_ms = 200;  // a lookup the engine waits for: then a miss
  int64_t load_timeout_ms = 2'000;  // one run's Lookup + Get
  int64_t save_timeout_ms = 5'000;  // one batch's puts
  int64_t believe_ms = 1'000;       // how long a lookup's answer stands
  int32_t max_in_flight = 1'024;    // loads and saves queued or running, each
  int64_t max_known_blocks = 1 << 20;  // lookup answers remembered; past it they start over
};

class KvStoreConnector : public kv::KvConnector {
 public:
  // InvalidArgument for a scope StoreKeySpace refuses or a non-positive block_bytes.
  // `data_plane_transport`, when given, is the transport of the client's data plane
  // (KvStoreClientOptions::data_plane): the connector keeps it until the client is gone.
  static absl::StatusOr<std::unique_ptr<KvStoreConnector>> Create(
      std::unique_ptr<KvStoreClient> client, const KvStoreConnectorOptions& options,
      std::unique_ptr<kv::KvTransport> data_plane_transport = nullptr);
  ~KvStoreConnector() override;  // waits for the calls in flight (each bounded by its deadline)
  KvStoreConnector(const KvStoreConnector&) = delete;
  KvStoreConnector& operator=(const KvStoreConnector&) = delete;

  std::string_view name() const override { return "kv-store"; }
  kv::Tier tier() const override { return kv::Tier::kStore; }
  std::optional<kv::SharedKeySpace> shared_key_space() const override { return keys_.id(); }
  uint64_t num_lookups_answered() const override { return lookups_answered_.load(std::memory_order_acquire); }
  kv::KvConnectorMatch Match(std::span<const kv::BlockHash> hashes, size_t first, size_t limit) override;
  bool Contains(const kv::BlockHash& hash) const override;
  bool CanStartLoad() const override;
  bool CanStartSave() const override;
  absl::StatusOr<int64_t> StartLoad(const kv::BlockHash& hash, std::span<std::byte> dst) override;
  absl::StatusOr<int64_t> StartSave(const kv::BlockHash& hash, const kv::BlockHash& parent_hash,
                                    std::span<const std::byte> payload, uint64_t checksum) override;
  std::vector<kv::KvIoCompletion> Poll() override;
  std::vector<kv::KvIoCompletion> Drain() override;
  int32_t num_in_flight() const override;
  // None: the store announces what it holds itself; a worker's saves are not its blocks.
  std::vector<kv::KvEvent> DrainEvents() override { return {}; }
  const kv::KvTierStats& stats() const override { return stats_; }
  absl::Status CheckInvariants() const override;

  const KvStoreClient& client() const { return *client_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Known {
    bool present = false;
    kv::BlockHash parent;  // present blocks: the chain they were found in
    Clock::time_point until;
  };
  struct Lookup {
    std::vector<kv::BlockHash> hashes;  // chain order; hashes[0]'s parent is `parent`
    kv::BlockHash parent;
    absl::Time deadline;  // lookup_timeout_ms after it was asked, queueing included
  };
  struct Load {
    int64_t ticket = 0;
    kv::BlockHash hash;
    kv::BlockHash parent;
    std::span<std::byte> dst;
  };
  struct Save {
    int64_t ticket = 0;
    kv::BlockHash hash;
    std::span<const std::byte> payload;
    uint64_t checksum = 0;
  };

  KvStoreConnector(std::unique_ptr<KvStoreClient> client, const KvStoreConnectorOptions& options,
                   StoreKeySpace keys, std::unique_ptr<kv::KvTransport> data_plane_transport);
  // What is believed of `hash` now (nullptr: nothing).
  const Known* Believed(const kv::BlockHash& hash, Clock::time_point now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void BelieveLocked(const kv::BlockHash& hash, Known known) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LookupLoop();
  void LoadLoop();
  void SaveLoop();
  // One run of consecutive blocks: Lookup + Get; one completion per block.
  void LoadRun(std::span<const Load> run);
  // A successful save's block is believed held unless `believe` is false (a restart was
  // seen while it was being put).
  void Complete(kv::KvIoCompletion completion, bool believe = true) ABSL_LOCKS_EXCLUDED(mu_);
  // The restarts the client has seen so far (KvStoreClientStats::epoch_changes).
  int64_t ClientRestarts() const { return client_->stats().epoch_changes; }
  // Forgets every belief when the client saw a restart since the last call. Returns
  // whether no restart was seen since `restarts_before` (ClientRestarts() before a call):
  // only then may what that call answered be believed.
  bool ForgetIfRestartedLocked(int64_t restarts_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<kv::KvTransport> data_plane_transport_;  // outlives client_
  const std::unique_ptr<KvStoreClient> client_;
  const KvStoreConnectorOptions options_;
  const StoreKeySpace keys_;

  mutable absl::Mutex mu_;
  std::atomic<uint64_t> lookups_answered_{0};  // num_lookups_answered
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<kv::BlockHash, Known> known_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<kv::BlockHash> looking_up_ ABSL_GUARDED_BY(mu_);  // first hash of each lookup in flight
  std::deque<Lookup> lookups_ ABSL_GUARDED_BY(mu_);
  std::deque<Load> loads_ ABSL_GUARDED_BY(mu_);
  std::deque<Save> saves_ ABSL_GUARDED_BY(mu_);
  int32_t loads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or running
  int32_t saves_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<kv::KvIoCompletion> done_ ABSL_GUARDED_BY(mu_);
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t restarts_seen_ ABSL_GUARDED_BY(mu_) = 0;  // the client's epoch changes, as of the last forget

  // The engine thread's (Match, Poll).
  kv::KvTierStats stats_;
  kv::BusyBandwidth read_bandwidth_{{.half_life_seconds = kv::kDefaultBandwidthHalfLifeSeconds}};
  kv::BusyBandwidth write_bandwidth_{{.half_life_seconds = kv::kDefaultBandwidthHalfLifeSeconds}};
  absl::flat_hash_map<int64_t, Clock::time_point> started_;  // by ticket: when Start* queued it

  std::thread lookup_thread_;
  std::thread load_thread_;
  std::thread save_thread_;
};

}  // namespace kvmesh::kv_store
