#include "kv_store/kv_store_connector.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "kv/checksum.h"
#include "kv_store/kv_store_wire.h"

namespace kvmesh::kv_store {
namespace {

absl::Time DeadlineIn(int64_t ms) { return absl::Now() + absl::Milliseconds(ms); }

}  // namespace

absl::StatusOr<std::unique_ptr<KvStoreConnector>> KvStoreConnector::Create(
    std::unique_ptr<KvStoreClient> client, const KvStoreConnectorOptions& options,
    std::unique_ptr<kv::KvTransport> data_plane_transport) {
  if (client == nullptr) return absl::InvalidArgumentError("kv-store connector: no client");
  if (options.block_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv-store connector: block_bytes must be positive, got ",
                                                   options.block_bytes));
  }
  absl::StatusOr<StoreKeySpace> keys = StoreKeySpace::Create(options.scope);
  if (!keys.ok()) return keys.status();
  return std::unique_ptr<KvStoreConnector>(
      new KvStoreConnector(std::move(client), options, *keys, std::move(data_plane_transport)));
}

KvStoreConnector::KvStoreConnector(std::unique_ptr<KvStoreClient> client, const KvStoreConnectorOptions& options,
                                   StoreKeySpace keys, std::unique_ptr<kv::KvTransport> data_plane_transport)
    : data_plane_transport_(std::move(data_plane_transport)), client_(std::move(client)), options_(options), keys_(keys) {
  lookup_thread_ = std::thread([this] { LookupLoop(); });
  load_thread_ = std::thread([this] { LoadLoop(); });
  save_thread_ = std::thread([this] { SaveLoop(); });
}

KvStoreConnector::~KvStoreConnector() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  lookup_thread_.join();
  load_thread_.join();
  save_thread_.join();
}

const KvStoreConnector::Known* KvStoreConnector::Believed(const kv::BlockHash& hash, Clock::time_point now) const {
  const auto it = known_.find(hash);
  return it == known_.end() || it->second.until < now ? nullptr : &it->second;
}

void KvStoreConnector::BelieveLocked(const kv::BlockHash& hash, Known known) {
  // NOTE: a plain cap, not an LRU: answers are short-lived (believe_ms) and a forgotten
  // one only costs another lookup.
  if (static_cast<int64_t>(known_.size()) >= options_.max_known_blocks) known_.clear();
  known_[hash] = known;
}

kv::KvConnectorMatch KvStoreConnector::Match(std::span<const kv::BlockHash> hashes, size_t first, size_t limit) {
  ++stats_.queries;
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  size_t i = first;
  bool miss = false;  // a block known to be missing ends the run
  for (; i < limit; ++i) {
    const Known* k = Believed(hashes[i], now);
    if (k == nullptr) break;
    if (!k->present) {
      miss = true;
      break;
    }
  }
  const auto held = static_cast<int32_t>(i - first);
  if (held > 0) ++stats_.hits;
  if (i == limit || miss) return {.num_blocks = held};
  // Unknown from hashes[i] on: ask the store (once; a lookup of it may be in flight).
  if (looking_up_.insert(hashes[i]).second) {
    const size_t n = std::min(limit - i, static_cast<size_t>(kMaxKeysPerRequest));
    lookups_.push_back(Lookup{.hashes = std::vector<kv::BlockHash>(hashes.begin() + static_cast<std::ptrdiff_t>(i),
                                                                  hashes.begin() + static_cast<std::ptrdiff_t>(i + n)),
                              .parent = i == 0 ? kv::kRootBlockHash : hashes[i - 1],
                              .deadline = DeadlineIn(options_.lookup_timeout_ms)});
  }
  return {.num_blocks = held, .pending = true};
}

bool KvStoreConnector::Contains(const kv::BlockHash& hash) const {
  absl::ReaderMutexLock lock(&mu_);
  const Known* k = Believed(hash, Clock::now());
  return k != nullptr && k->present;
}

bool KvStoreConnector::CanStartLoad() const {
  absl::ReaderMutexLock lock(&mu_);
  return loads_in_flight_ < options_.max_in_flight;
}

bool KvStoreConnector::CanStartSave() const {
  absl::ReaderMutexLock lock(&mu_);
  return saves_in_flight_ < options_.max_in_flight;
}

absl::StatusOr<int64_t> KvStoreConnector::StartLoad(const kv::BlockHash& hash, std::span<std::byte> dst) {
  if (static_cast<int64_t>(dst.size()) != options_.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv-store load: a ", dst.size(), "-byte slot for ", options_.block_bytes, "-byte blocks"));
  }
  const Clock::time_point now = Clock::now();
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    const Known* k = Believed(hash, now);
    if (k == nullptr || !k->present) return absl::NotFoundError("kv-store: block not held (as far as known)");
    if (loads_in_flight_ >= options_.max_in_flight) return absl::ResourceExhaustedError("kv-store: load queue full");
    ticket = next_ticket_++;
    loads_.push_back(Load{.ticket = ticket, .hash = hash, .parent = k->parent, .dst = dst});
    ++loads_in_flight_;
  }
  started_[ticket] = now;
  read_bandwidth_.Begin(now);
  return ticket;
}

absl::StatusOr<int64_t> KvStoreConnector::StartSave(const kv::BlockHash& hash, const kv::BlockHash& /*parent_hash*/,
                                                    std::span<const std::byte> payload, uint64_t checksum) {
  if (static_cast<int64_t>(payload.size()) != options_.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv-store save: a ", payload.size(), "-byte block for ", options_.block_bytes, "-byte blocks"));
  }
  const Clock::time_point now = Clock::now();
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    if (const Known* k = Believed(hash, now); k != nullptr && k->present) {
      return absl::AlreadyExistsError("kv-store: held already");
    }
    if (saves_in_flight_ >= options_.max_in_flight) return absl::ResourceExhaustedError("kv-store: save queue full");
    ticket = next_ticket_++;
    saves_.push_back(Save{.ticket = ticket, .hash = hash, .payload = payload, .checksum = checksum});
    ++saves_in_flight_;
  }
  started_[ticket] = now;
  write_bandwidth_.Begin(now);
  return ticket;
}

std::vector<kv::KvIoCompletion> KvStoreConnector::Poll() {
  std::vector<kv::KvIoCompletion> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(done_);
    stats_.peer_restarts = restarts_seen_;
    stats_.reads_in_flight = loads_in_flight_;
  }
  for (const kv::KvIoCompletion& c : done) {
    const auto it = started_.find(c.ticket);
    if (it == started_.end()) continue;
    const bool read = c.kind == kv::KvIoCompletion::Kind::kRead;
    // NOTE: a load that failed other than by checksum waited on a store that died, hung,
    // restarted or lost the block: that time says nothing of how fast the stores serve,
    // and counted, it would have the engine recompute every store's blocks for a while.
    if (read && !c.status.ok() && c.status.code() != absl::StatusCode::kDataLoss) {
      read_bandwidth_.Forget(it->second);
    } else {
      (read ? read_bandwidth_ : write_bandwidth_).End(it->second, c.completed_at, c.bytes);
    }
    started_.erase(it);
    if (read && c.status.ok()) {
      ++stats_.blocks_onboarded;
      stats_.bytes_onboarded += c.bytes;
    } else if (read && c.status.code() == absl::StatusCode::kDataLoss) {
      ++stats_.checksum_failures;
    } else if (read) {
      ++stats_.read_failures;  // recomputed, like a checksum failure
    } else if (!read && c.status.ok()) {
      ++stats_.blocks_offloaded;
      stats_.bytes_offloaded += c.bytes;
    } else if (!read) {
      ++stats_.write_failures;
    }
  }
  stats_.read_bytes_per_second = read_bandwidth_.units_per_second();
  stats_.write_bytes_per_second = write_bandwidth_.units_per_second();
  stats_.in_flight = num_in_flight();
  return done;
}

std::vector<kv::KvIoCompletion> KvStoreConnector::Drain() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](KvStoreConnector* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return self->loads_in_flight_ == 0 && self->saves_in_flight_ == 0;
        },
        this));
  }
  return Poll();
}

int32_t KvStoreConnector::num_in_flight() const {
  absl::ReaderMutexLock lock(&mu_);
  return loads_in_flight_ + saves_in_flight_;
}

absl::Status KvStoreConnector::CheckInvariants() const {
  absl::ReaderMutexLock lock(&mu_);
  if (loads_in_flight_ < static_cast<int32_t>(loads_.size()) || saves_in_flight_ < static_cast<int32_t>(saves_.size())) {
    return absl::InternalError(absl::StrCat("kv-store connector: ", loads_.size(), " loads and ", saves_.size(),
                                            " saves queued but ", loads_in_flight_, " and ", saves_in_flight_,
                                            " counted in flight"));
  }
  return absl::OkStatus();
}

bool KvStoreConnector::ForgetIfRestartedLocked(int64_t restarts_before) {
  const int64_t restarts = ClientRestarts();
  if (restarts != restarts_seen_) {
    KVMESH_LOG(kInfo) << "kv-store restarted (a new epoch): forgetting what it was believed to hold"
                      << LogKv("restarts_seen", restarts) << LogKv("blocks_forgotten", known_.size());
    restarts_seen_ = restarts;
    known_.clear();
  }
  return restarts == restarts_before;
}

void KvStoreConnector::Complete(kv::KvIoCompletion completion, bool believe) {
  completion.completed_at = Clock::now();
  absl::MutexLock lock(&mu_);
  if (completion.kind == kv::KvIoCompletion::Kind::kRead) {
    --loads_in_flight_;
  } else {
    --saves_in_flight_;
    if (completion.status.ok() && believe) {
      BelieveLocked(completion.hash,
                    Known{.present = true, .until = completion.completed_at + std::chrono::milliseconds(options_.believe_ms)});
    }
  }
  done_.push_back(std::move(completion));
}

void KvStoreConnector::LookupLoop() {
  for (;;) {
    Lookup job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvStoreConnector* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stopping_ || !self->lookups_.empty();
          },
          this));
      if (stopping_) return;
      job = std::move(lookups_.front());
      lookups_.pop_front();
    }
    // A lookup that waited its whole deadline behind others (a hung store makes each
    // take its deadline) is a miss unasked: the request waiting for it goes on.
    const int64_t restarts_before = ClientRestarts();
    KvStoreLookup found;
    if (absl::Now() < job.deadline) {
      found = client_->Lookup(keys_.Keys(job.hashes), job.deadline);
    } else {
      found.error = absl::DeadlineExceededError("the lookup waited past its deadline behind others");
    }
    // NOTE: the lease is not kept for the load: the load takes its own (the engine may
    // decide to recompute, or load much later); a held lease would only delay eviction.
    if (found.num_present > 0) client_->Release(found, DeadlineIn(options_.lookup_timeout_ms));
    if (!found.error.ok()) {
      KVMESH_LOG(kInfo) << "kv-store lookup: " << found.error.message() << ": a miss";
    }
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(options_.believe_ms);
    absl::MutexLock lock(&mu_);
    // NOTE: an answer that came back while a restart was seen may be the old epoch's: it
    // counts as a miss (the restarted store is empty anyway).
    const bool fresh = ForgetIfRestartedLocked(restarts_before);
    const auto present = fresh ? static_cast<size_t>(std::max(found.num_present, 0)) : 0;
    for (size_t i = 0; i < present && i < job.hashes.size(); ++i) {
      BelieveLocked(job.hashes[i],
                    Known{.present = true, .parent = i == 0 ? job.parent : job.hashes[i - 1], .until = until});
    }
    // The first block past the run is a miss (a dead or slow store's too), so the wait of
    // whoever asked ends here either way.
    if (present < job.hashes.size()) BelieveLocked(job.hashes[present], Known{.present = false, .until = until});
    looking_up_.erase(job.hashes.front());
    lookups_answered_.fetch_add(1, std::memory_order_release);
  }
}

void KvStoreConnector::LoadLoop() {
  for (;;) {
    std::vector<Load> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvStoreConnector* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stopping_ || !self->loads_.empty();
          },
          this));
      if (stopping_ && loads_.empty()) return;
      batch.assign(std::make_move_iterator(loads_.begin()), std::make_move_iterator(loads_.end()));
      loads_.clear();
    }
    // Runs of consecutive blocks of one chain: one Lookup and one Get each.
    size_t begin = 0;
    for (size_t i = 1; i <= batch.size(); ++i) {
      if (i < batch.size() && batch[i].parent == batch[i - 1].hash) continue;
      LoadRun(std::span<const Load>(batch).subspan(begin, i - begin));
      begin = i;
    }
  }
}

void KvStoreConnector::LoadRun(std::span<const Load> run) {
  std::vector<kv::BlockHash> hashes;
  hashes.reserve(run.size());
  for (const Load& l : run) hashes.push_back(l.hash);
  const std::vector<StoreKey> keys = keys_.Keys(hashes);
  const absl::Time deadline = DeadlineIn(options_.load_timeout_ms);
  const int64_t restarts_before = ClientRestarts();
  KvStoreLookup found = client_->Lookup(keys, deadline);
  std::vector<std::span<std::byte>> out;
  const size_t present = std::min(run.size(), static_cast<size_t>(std::max(found.num_present, 0)));
  for (size_t i = 0; i < present; ++i) out.push_back(run[i].dst);
  KvStoreGetResult got;
  if (!out.empty()) {
    got = client_->Get(found, out, deadline);
  } else {
    got.error = found.error.ok() ? absl::NotFoundError("kv-store: evicted since the lookup") : found.error;
  }
  if (found.num_present > 0 && got.num_loaded < found.num_present) client_->Release(found, deadline);
  for (size_t i = 0; i < run.size(); ++i) {
    kv::KvIoCompletion c{.ticket = run[i].ticket, .kind = kv::KvIoCompletion::Kind::kRead, .hash = run[i].hash};
    if (static_cast<int32_t>(i) < got.num_loaded) {
      c.bytes = static_cast<int64_t>(run[i].dst.size());
      c.checksum = kv::Checksum(run[i].dst);  // the client verified the store's checksum of these bytes
    } else {
      c.status = got.error.ok() ? absl::NotFoundError("kv-store: not loaded") : got.error;
    }
    Complete(std::move(c));
  }
  absl::MutexLock lock(&mu_);
  ForgetIfRestartedLocked(restarts_before);
  if (!got.error.ok()) {
    // What the store no longer has is forgotten, so the next lookup asks again.
    for (size_t i = static_cast<size_t>(std::max(got.num_loaded, 0)); i < run.size(); ++i) known_.erase(run[i].hash);
  }
}

void KvStoreConnector::SaveLoop() {
  for (;;) {
    std::vector<Save> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvStoreConnector* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stopping_ || !self->saves_.empty();
          },
          this));
      if (stopping_ && saves_.empty()) return;
      const size_t n = std::min(saves_.size(), static_cast<size_t>(kMaxKeysPerRequest));
      batch.assign(std::make_move_iterator(saves_.begin()),
                   std::make_move_iterator(saves_.begin() + static_cast<std::ptrdiff_t>(n)));
      saves_.erase(saves_.begin(), saves_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    std::vector<kv::BlockHash> hashes;
    std::vector<std::span<const std::byte>> blocks;
    std::vector<uint64_t> checksums;
    // NOTE: tail first: the store commits in this order, so a chain's head is its most
    // recently used block and is evicted last (BlockStore's eviction).
    std::reverse(batch.begin(), batch.end());
    for (const Save& s : batch) {
      hashes.push_back(s.hash);
      blocks.push_back(s.payload);
      checksums.push_back(s.checksum);
    }
    const std::vector<StoreKey> keys = keys_.Keys(hashes);
    const int64_t restarts_before = ClientRestarts();
    const KvStorePutResult put = client_->Put(keys, blocks, checksums, DeadlineIn(options_.save_timeout_ms));
    bool fresh = false;
    {
      absl::MutexLock lock(&mu_);
      fresh = ForgetIfRestartedLocked(restarts_before);
    }
    // NOTE: the result counts blocks, not which ones: all of the batch succeeded, or the
    // batch is reported failed block by block (a save is only ever a missed chance).
    const bool all = put.num_committed + put.num_present == static_cast<int32_t>(batch.size());
    for (const Save& s : batch) {
      kv::KvIoCompletion c{.ticket = s.ticket, .kind = kv::KvIoCompletion::Kind::kWrite, .hash = s.hash};
      if (all) {
        c.bytes = static_cast<int64_t>(s.payload.size());
      } else {
        c.status = put.error.ok() ? absl::ResourceExhaustedError("kv-store: not stored") : put.error;
      }
      Complete(std::move(c), /*believe=*/fresh);
    }
  }
}

}  // namespace kvmesh::kv_store
