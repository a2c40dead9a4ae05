#include "kv_store/kv_store_client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kv/checksum.h"
#include "kv_store/kv_store_wire.h"
#include "kvmesh/v1/kv_store.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace kvmesh::kv_store {

struct KvStoreClient::Store {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvStore::Stub> stub;
};

namespace {

// The chain positions homed on one store, in chain order.
struct StoreShare {
  int store = -1;
  std::vector<int32_t> indices;
};

std::vector<StoreShare> ShareByStore(std::span<const int> homes, int num_stores) {
  std::vector<StoreShare> by_store(static_cast<size_t>(num_stores));
  for (size_t i = 0; i < homes.size(); ++i) {
    if (homes[i] < 0) continue;
    by_store[homes[i]].store = homes[i];
    by_store[homes[i]].indices.push_back(static_cast<int32_t>(i));
  }
  std::erase_if(by_store, [](const StoreShare& s) { return s.indices.empty(); });
  return by_store;
}

// Each share cut into pieces of at most `max_blocks` (0: none), moved concurrently: over
// the data plane the check of one piece's landed blocks (the store's on a put, this
// client's on a get) then overlaps the transfer of the next, instead of following the
// whole transfer.
std::vector<StoreShare> SplitShares(std::vector<StoreShare> shares, int32_t max_blocks) {
  if (max_blocks <= 0) return shares;
  std::vector<StoreShare> pieces;
  for (StoreShare& share : shares) {
    for (size_t first = 0; first < share.indices.size(); first += static_cast<size_t>(max_blocks)) {
      const size_t last = std::min(share.indices.size(), first + static_cast<size_t>(max_blocks));
      pieces.push_back({.store = share.store,
                        .indices = std::vector<int32_t>(share.indices.begin() + static_cast<std::ptrdiff_t>(first),
                                                        share.indices.begin() + static_cast<std::ptrdiff_t>(last))});
    }
  }
  return pieces;
}

// Runs fn(0) .. fn(n - 1) concurrently (fn(0) on this thread) and returns when all have.
// NOTE: one thread per store beyond the first: a call talks to a handful of stores and
// moves whole KV blocks, so a thread start (tens of microseconds) is noise.
template <typename Fn>
void RunConcurrently(size_t n, const Fn& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n > 0 ? n - 1 : 0);
  for (size_t i = 1; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  if (n > 0) fn(0);
  for (std::thread& t : threads) t.join();
}

void PrepareContext(grpc::ClientContext* context, absl::Time deadline, const std::string& api_key) {
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!api_key.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", api_key));
}

absl::Status Annotate(const absl::Status& status, const std::string& address) {
  return absl::Status(status.code(), absl::StrCat("kv-store ", address, ": ", status.message()));
}

// The length of the leading run of true flags.
int32_t LeadingRun(const std::vector<char>& flags) {
  int32_t n = 0;
  while (n < static_cast<int32_t>(flags.size()) && flags[n]) ++n;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStoreClient>> KvStoreClient::Create(KvStoreClientOptions options) {
  if (options.addresses.empty()) return absl::InvalidArgumentError("kv-store client: no store addresses");
  absl::flat_hash_set<std::string> seen;
  for (const std::string& address : options.addresses) {
    if (address.empty() || !seen.insert(address).second) {
      return absl::InvalidArgumentError(absl::StrCat("kv-store client: store address \"", address,
                                                     "\" is empty or given twice"));
    }
  }
  return std::unique_ptr<KvStoreClient>(new KvStoreClient(std::move(options)));
}

KvStoreClient::KvStoreClient(KvStoreClientOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : Clock::Real()),
      ring_(options_.addresses, absl::Milliseconds(options_.warmup_ms)),
      beliefs_(options_.addresses.size()) {
  for (const std::string& address : options_.addresses) {
    auto store = std::make_unique<Store>();
    store->address = address;
    store->channel = rpc::CreateChannel(address, options_.channel);
    store->stub = v1::KvStore::NewStub(store->channel);
    stores_.push_back(std::move(store));
  }
}

KvStoreClient::~KvStoreClient() = default;

bool KvStoreClient::ObserveEpochLocked(int store, uint64_t epoch) {
  StoreBelief& belief = beliefs_[store];
  if (belief.epoch == epoch) return true;
  const bool first = belief.epoch == 0;
  belief.epoch = epoch;
  belief.held.clear();
  if (first) return true;
  // It restarted, empty: whatever this client believed it held is gone, and it gets
  // puts gradually again.
  ++stats_.epoch_changes;
  ring_.StartWarmup(store, clock_.Now());
  return false;
}

void KvStoreClient::RememberHeldLocked(int store, const StoreKey& key) {
  if (options_.max_known_blocks_per_store <= 0) return;
  absl::flat_hash_set<StoreKey>& held = beliefs_[store].held;
  if (static_cast<int64_t>(held.size()) >= options_.max_known_blocks_per_store) held.clear();
  held.insert(key);
}

KvStoreLookup KvStoreClient::Lookup(std::span<const StoreKey> keys, absl::Time deadline) {
  KvStoreLookup result;
  if (keys.empty()) return result;
  if (absl::Status s = CheckKeyCount(static_cast<int>(std::min<size_t>(keys.size(), kMaxKeysPerRequest + 1)), "keys");
      !s.ok()) {
    result.error = s;
    return result;
  }
  std::vector<int> homes(keys.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) homes[i] = ring_.Home(keys[i]);
  }
  const std::vector<StoreShare> shares = ShareByStore(homes, num_stores());
  std::vector<absl::Status> statuses(shares.size());
  std::vector<v1::KvLookupResponse> responses(shares.size());
  RunConcurrently(shares.size(), [&](size_t g) {
    v1::KvLookupRequest request;
    for (const int32_t i : shares[g].indices) ToProto(keys[i], request.add_keys());
    grpc::ClientContext context;
    PrepareContext(&context, deadline, options_.api_key);
    statuses[g] = rpc::FromGrpcStatus(stores_[shares[g].store]->stub->Lookup(&context, request, &responses[g]));
  });

  std::vector<char> present(keys.size(), 0);
  absl::MutexLock lock(&mu_);
  ++stats_.lookups;
  for (size_t g = 0; g < shares.size(); ++g) {
    const int store = shares[g].store;
    if (!statuses[g].ok()) {
      ++stats_.store_errors;
      if (result.error.ok()) result.error = Annotate(statuses[g], stores_[store]->address);
      continue;
    }
    const v1::KvLookupResponse& response = responses[g];
    ObserveEpochLocked(store, response.epoch());
    const std::vector<int32_t>& indices = shares[g].indices;
    const size_t n = static_cast<size_t>(std::clamp<int32_t>(response.num_present(), 0, indices.size()));
    for (size_t j = 0; j < n; ++j) {
      present[indices[j]] = 1;
      RememberHeldLocked(store, keys[indices[j]]);
    }
    if (n < indices.size()) beliefs_[store].held.erase(keys[indices[n]]);  // it misses there now
    if (response.lease_id() != 0) {
      result.leases.push_back({.store = store, .epoch = response.epoch(), .lease_id = response.lease_id()});
    }
  }
  result.num_present = LeadingRun(present);
  stats_.lookup_hit_blocks += result.num_present;
  result.keys.assign(keys.begin(), keys.begin() + result.num_present);
  result.homes.assign(homes.begin(), homes.begin() + result.num_present);
  return result;
}

KvStoreGetResult KvStoreClient::Get(KvStoreLookup& lookup, std::span<const std::span<std::byte>> out,
                                    absl::Time deadline) {
  KvStoreGetResult result;
  if (out.size() > static_cast<size_t>(lookup.num_present) || lookup.keys.size() < out.size() ||
      lookup.homes.size() < out.size()) {
    result.error = absl::InvalidArgumentError(
        absl::StrCat("kv-store get: ", out.size(), " blocks asked of a lookup with ", lookup.num_present));
    return result;
  }
  const std::vector<StoreShare> shares =
      SplitShares(ShareByStore(std::span<const int>(lookup.homes).first(out.size()), num_stores()),
                  options_.data_plane.enabled() ? options_.data_plane.max_blocks_per_transfer : 0);
  std::vector<KvStoreLookup::StoreLease*> leases(shares.size(), nullptr);
  for (size_t g = 0; g < shares.size(); ++g) {
    for (KvStoreLookup::StoreLease& lease : lookup.leases) {
      if (lease.store == shares[g].store) leases[g] = &lease;
    }
  }
  struct ShareResult {
    absl::Status status;
    uint64_t epoch_seen = 0;  // a block's epoch that differed from the lease's
    int64_t bytes = 0;
    int64_t checksum_failures = 0;
    int64_t ucx_blocks = 0;
    int64_t ucx_fallbacks = 0;
  };
  std::vector<ShareResult> share_results(shares.size());
  std::vector<char> loaded(out.size(), 0);
  // The blocks of `indices` over the gRPC stream, or (a lease descriptor given) their
  // checksums after the store pushed them: in_place_sums gets one per block then.
  const auto stream_get = [&](size_t g, ShareResult& r, std::span<const int32_t> indices, const std::string& ucx_lease,
                              std::vector<uint64_t>* in_place_sums) {
    const uint64_t epoch = leases[g] != nullptr ? leases[g]->epoch : 0;
    v1::KvGetRequest request;
    request.set_epoch(epoch);
    if (leases[g] != nullptr) {
      // NOTE: the first piece of a store's share to end drops its lease; the blocks of
      // the others are held by their own transfers (or served while still there).
      request.set_lease_id(leases[g]->lease_id);
      request.set_release_lease(true);
    }
    for (const int32_t i : indices) ToProto(lookup.keys[i], request.add_keys());
    if (!ucx_lease.empty()) request.set_ucx_lease_descriptor(ucx_lease);
    grpc::ClientContext context;
    PrepareContext(&context, deadline, options_.api_key);
    std::unique_ptr<grpc::ClientReader<v1::KvGetBlock>> reader = stores_[shares[g].store]->stub->Get(&context, request);
    v1::KvGetBlock block;
    size_t j = 0;
    for (; j < indices.size() && reader->Read(&block); ++j) {
      const int32_t i = indices[j];
      const std::string& data = block.data();
      if (epoch != 0 && block.epoch() != epoch) {
        r.epoch_seen = block.epoch();
        r.status = absl::FailedPreconditionError("the store restarted since the lookup (its epoch changed)");
      } else if (FromProto(block.key()) != lookup.keys[i]) {
        r.status = absl::DataLossError(absl::StrCat("block ", j, " of the stream is not the key asked for"));
      } else if (block.in_place() != (in_place_sums != nullptr) || (block.in_place() && !data.empty())) {
        r.status = absl::DataLossError(absl::StrCat("block ", j, " of the stream is not in the form asked for"));
      } else if (in_place_sums != nullptr) {
        in_place_sums->push_back(block.checksum());
        continue;
      } else if (data.size() != out[i].size()) {
        r.status = absl::DataLossError(
            absl::StrCat("block ", lookup.keys[i].ToHex(), " has ", data.size(), " bytes, ", out[i].size(),
                         " expected"));
      } else if (kv::Checksum({reinterpret_cast<const std::byte*>(data.data()), data.size()}) != block.checksum()) {
        ++r.checksum_failures;
        r.status = absl::DataLossError(absl::StrCat("block ", lookup.keys[i].ToHex(), ": checksum mismatch"));
      }
      if (!r.status.ok()) break;
      std::memcpy(out[i].data(), data.data(), data.size());
      loaded[i] = 1;
      r.bytes += static_cast<int64_t>(data.size());
    }
    if (!r.status.ok()) context.TryCancel();  // stop the rest of the stream
    const absl::Status finished = rpc::FromGrpcStatus(reader->Finish());
    if (r.status.ok() && !finished.ok()) r.status = finished;
    if (r.status.ok() && j < indices.size()) r.status = absl::NotFoundError("the stream ended early");
  };
  const KvStoreDataPlane& plane = options_.data_plane;
  RunConcurrently(shares.size(), [&](size_t g) {
    ShareResult& r = share_results[g];
    const std::vector<int32_t>& indices = shares[g].indices;
    std::vector<kv::BlockId> dst;
    if (plane.enabled()) {
      for (const int32_t i : indices) {
        const int32_t b = plane.BlockOf(out[i]);
        if (b < 0) break;
        dst.push_back(kv::BlockId{b});
      }
    }
    if (dst.size() == indices.size()) {
      // The data plane: lease the destination blocks, let the store push, verify.
      struct LeaseEnd {
        absl::Mutex mu;
        absl::Status status ABSL_GUARDED_BY(mu);
        bool done ABSL_GUARDED_BY(mu) = false;
        bool released ABSL_GUARDED_BY(mu) = false;
      };
      auto end = std::make_shared<LeaseEnd>();
      absl::StatusOr<kv::KvLeaseGrant> grant = plane.transport->OpenLease(
          plane.pool,
          {.block_ids = dst,
           .on_released =
               [end] {
                 absl::MutexLock lock(&end->mu);
                 end->released = true;
               }},
          [end](const absl::Status& status, const kv::KvTransferStats&) {
            absl::MutexLock lock(&end->mu);
            end->status = status;
            end->done = true;
          });
      if (grant.ok()) {
        std::vector<uint64_t> sums;
        stream_get(g, r, indices, grant->descriptor, &sums);
        if (!r.status.ok()) plane.transport->CloseLease(grant->lease_token, r.status);
        bool released = false;
        absl::Status landed;
        {
          absl::MutexLock lock(&end->mu);
          released = end->mu.AwaitWithDeadline(absl::Condition(&end->released), deadline);
          landed = end->done ? end->status : absl::DeadlineExceededError("the lease did not end");
        }
        if (r.status.ok() && !landed.ok()) r.status = landed;
        if (r.status.ok() && released) {
          for (size_t j = 0; j < indices.size(); ++j) {
            const int32_t i = indices[j];
            if (plane.after_landing) plane.after_landing(out[i]);
            if (kv::Checksum(out[i]) != sums[j]) {
              ++r.checksum_failures;
              r.status = absl::DataLossError(absl::StrCat("block ", lookup.keys[i].ToHex(),
                                                          ": checksum mismatch after its UCX transfer"));
              break;
            }
            loaded[i] = 1;
            r.bytes += static_cast<int64_t>(out[i].size());
            ++r.ucx_blocks;
          }
        }
        if (r.status.ok()) return;
        // Nothing of it is served unverified: the blocks that did not verify go over the
        // stream, once nothing can write into them any more (else they stay misses).
        if (!released) return;
        ++r.ucx_fallbacks;
        for (const int32_t i : indices) loaded[i] = 0;
        r.bytes = 0;
        r.ucx_blocks = 0;
        r.status = absl::OkStatus();
      }
    }
    stream_get(g, r, indices, "", nullptr);
  });

  result.num_loaded = LeadingRun(loaded);
  absl::MutexLock lock(&mu_);
  for (size_t g = 0; g < shares.size(); ++g) {
    const ShareResult& r = share_results[g];
    const int store = shares[g].store;
    if (leases[g] != nullptr) leases[g]->released = true;
    stats_.get_bytes += r.bytes;
    stats_.checksum_failures += r.checksum_failures;
    stats_.ucx_get_blocks += r.ucx_blocks;
    stats_.ucx_fallbacks += r.ucx_fallbacks;
    if (r.epoch_seen != 0) ObserveEpochLocked(store, r.epoch_seen);
    if (!r.status.ok()) {
      ++stats_.store_errors;
      // Refused for its epoch: the store restarted; forget it until it is heard from.
      if (r.status.code() == absl::StatusCode::kFailedPrecondition) beliefs_[store].held.clear();
      for (const int32_t i : shares[g].indices) {
        if (!loaded[i]) beliefs_[store].held.erase(lookup.keys[i]);
      }
    }
  }
  stats_.get_blocks += std::count(loaded.begin(), loaded.end(), 1);
  if (result.num_loaded < static_cast<int32_t>(out.size())) {
    const int store = lookup.homes[result.num_loaded];
    for (size_t g = 0; g < shares.size(); ++g) {
      const std::vector<int32_t>& in = shares[g].indices;
      if (shares[g].store == store && std::find(in.begin(), in.end(), result.num_loaded) != in.end()) {
        result.error = Annotate(share_results[g].status, stores_[store]->address);
      }
    }
  }
  return result;
}

void KvStoreClient::Release(KvStoreLookup& lookup, absl::Time deadline) {
  std::vector<KvStoreLookup::StoreLease*> pending;
  for (KvStoreLookup::StoreLease& lease : lookup.leases) {
    if (!lease.released) pending.push_back(&lease);
  }
  std::vector<absl::Status> statuses(pending.size());
  std::vector<v1::KvReleaseResponse> responses(pending.size());
  RunConcurrently(pending.size(), [&](size_t g) {
    v1::KvReleaseRequest request;
    request.set_epoch(pending[g]->epoch);
    request.set_lease_id(pending[g]->lease_id);
    grpc::ClientContext context;
    PrepareContext(&context, deadline, options_.api_key);
    statuses[g] = rpc::FromGrpcStatus(stores_[pending[g]->store]->stub->Release(&context, request, &responses[g]));
  });
  absl::MutexLock lock(&mu_);
  for (size_t g = 0; g < pending.size(); ++g) {
    pending[g]->released = true;
    if (statuses[g].ok()) {
      ObserveEpochLocked(pending[g]->store, responses[g].epoch());
    } else {
      ++stats_.store_errors;
    }
  }
}

KvStorePutResult KvStoreClient::Put(std::span<const StoreKey> keys, std::span<const std::span<const std::byte>> blocks,
                                    std::span<const uint64_t> checksums, absl::Time deadline) {
  KvStorePutResult result;
  if (keys.empty()) return result;
  const size_t block_bytes = blocks.empty() ? 0 : blocks[0].size();
  const auto other_size = [&](std::span<const std::byte> b) { return b.size() != block_bytes; };
  if (keys.size() != blocks.size() || (!checksums.empty() && checksums.size() != keys.size()) || block_bytes == 0 ||
      std::any_of(blocks.begin(), blocks.end(), other_size)) {
    result.error = absl::InvalidArgumentError(
        "kv-store put: needs one non-empty block per key, all of one size, and one checksum per key or none");
    return result;
  }
  if (absl::Status s = CheckKeyCount(static_cast<int>(std::min<size_t>(keys.size(), kMaxKeysPerRequest + 1)), "keys");
      !s.ok()) {
    result.error = s;
    return result;
  }
  std::vector<int> targets(keys.size(), -1);
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_.Now();
    for (size_t i = 0; i < keys.size(); ++i) {
      const int target = ring_.PutTarget(keys[i], now);
      if (target < 0) {
        ++result.num_skipped;
      } else if (beliefs_[target].held.contains(keys[i])) {
        ++result.num_present;
      } else {
        targets[i] = target;
      }
    }
  }
  const std::vector<StoreShare> shares = SplitShares(
      ShareByStore(targets, num_stores()),
      options_.data_plane.enabled() ? options_.data_plane.max_blocks_per_transfer : 0);
  struct ShareResult {
    absl::Status status;
    uint64_t epoch = 0;                 // 0: no intent response
    std::vector<int32_t> present;       // chain positions the store holds already
    std::vector<int32_t> committed;     // chain positions written now
    int64_t bytes = 0;
    int64_t ucx_blocks = 0;
  };
  std::vector<ShareResult> share_results(shares.size());
  RunConcurrently(shares.size(), [&](size_t g) {
    ShareResult& r = share_results[g];
    const std::vector<int32_t>& indices = shares[g].indices;
    v1::KvStore::Stub& stub = *stores_[shares[g].store]->stub;
    v1::KvPutIntentRequest intent_request;
    for (const int32_t i : indices) ToProto(keys[i], intent_request.add_keys());
    intent_request.set_block_bytes(static_cast<int64_t>(block_bytes));
    // The data plane when every block of this share lies in its pool.
    std::vector<int32_t> src_of(keys.size(), -1);
    bool ucx = options_.data_plane.enabled();
    for (const int32_t i : indices) {
      if (!ucx) break;
      src_of[i] = options_.data_plane.BlockOf(blocks[i]);
      ucx = src_of[i] >= 0;
    }
    intent_request.set_ucx_lease(ucx);
    v1::KvPutIntentResponse intent;
    {
      grpc::ClientContext context;
      PrepareContext(&context, deadline, options_.api_key);
      r.status = rpc::FromGrpcStatus(stub.PutIntent(&context, intent_request, &intent));
    }
    if (!r.status.ok()) return;
    if (intent.blocks_size() != static_cast<int>(indices.size())) {
      r.status = absl::InternalError("PutIntent answered for another number of blocks");
      return;
    }
    r.epoch = intent.epoch();
    std::vector<std::pair<int32_t, uint64_t>> reserved;  // chain position, token
    for (size_t j = 0; j < indices.size(); ++j) {
      const v1::KvPutIntentResponse::Block& b = intent.blocks(static_cast<int>(j));
      if (b.outcome() == v1::KvPutIntentResponse::OUTCOME_PRESENT) r.present.push_back(indices[j]);
      if (b.outcome() == v1::KvPutIntentResponse::OUTCOME_RESERVED) reserved.emplace_back(indices[j], b.token());
    }
    if (reserved.empty()) return;
    const bool in_place = ucx && !intent.ucx_lease_descriptor().empty();
    if (in_place) {
      // Push every reserved block into the store's lease; commit them in place below.
      absl::StatusOr<std::unique_ptr<kv::KvPush>> push =
          options_.data_plane.transport->OpenPush(options_.data_plane.pool, intent.ucx_lease_descriptor());
      if (!push.ok()) {
        r.status = push.status();
        return;
      }
      std::vector<kv::BlockId> src;
      src.reserve(reserved.size());
      for (const auto& [i, token] : reserved) src.push_back(kv::BlockId{src_of[i]});
      if (absl::Status s = (*push)->PutLayer(0, 0, src); !s.ok()) {
        (*push)->Cancel();
        r.status = s;
        return;
      }
      std::promise<absl::Status> pushed;
      (*push)->Finish([&pushed](const absl::Status& status, const kv::KvTransferStats&) { pushed.set_value(status); });
      r.status = pushed.get_future().get();
      if (!r.status.ok()) return;
    }
    grpc::ClientContext context;
    PrepareContext(&context, deadline, options_.api_key);
    v1::KvPutResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::KvPutBlock>> writer = stub.Put(&context, &response);
    v1::KvPutBlock message;
    message.set_epoch(r.epoch);
    for (const auto& [i, token] : reserved) {
      ToProto(keys[i], message.mutable_key());
      message.set_token(token);
      message.set_checksum(checksums.empty() ? kv::Checksum(blocks[i]) : checksums[i]);
      if (in_place) {
        message.set_in_place(true);
      } else {
        message.set_data(reinterpret_cast<const char*>(blocks[i].data()), blocks[i].size());
      }
      // In place, the messages are a few dozen bytes: let gRPC coalesce them.
      const grpc::WriteOptions write_options =
          in_place ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions();
      if (!writer->Write(message, write_options)) break;  // the store ended the call: Finish says why
    }
    writer->WritesDone();
    r.status = rpc::FromGrpcStatus(writer->Finish());
    if (!r.status.ok()) return;
    for (const auto& [i, token] : reserved) {
      r.committed.push_back(i);
      r.bytes += static_cast<int64_t>(block_bytes);
    }
    if (in_place) r.ucx_blocks = static_cast<int64_t>(reserved.size());
  });

  absl::MutexLock lock(&mu_);
  for (size_t g = 0; g < shares.size(); ++g) {
    const ShareResult& r = share_results[g];
    const int store = shares[g].store;
    if (r.epoch != 0) ObserveEpochLocked(store, r.epoch);
    if (!r.status.ok()) {
      ++stats_.store_errors;
      if (result.error.ok()) result.error = Annotate(r.status, stores_[store]->address);
    } else {
      // Only after the whole stream succeeded: a failed stream may have committed some.
      for (const int32_t i : r.committed) RememberHeldLocked(store, keys[i]);
    }
    for (const int32_t i : r.present) RememberHeldLocked(store, keys[i]);
    result.num_committed += static_cast<int32_t>(r.committed.size());
    result.num_present += static_cast<int32_t>(r.present.size());
    result.num_not_stored +=
        static_cast<int32_t>(shares[g].indices.size() - r.committed.size() - r.present.size());
    stats_.put_blocks += static_cast<int64_t>(r.committed.size());
    stats_.put_bytes += r.bytes;
    stats_.ucx_put_blocks += r.ucx_blocks;
  }
  return result;
}

KvStoreClientStats KvStoreClient::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

uint64_t KvStoreClient::epoch(int store) const {
  absl::MutexLock lock(&mu_);
  return beliefs_[store].epoch;
}

}  // namespace kvmesh::kv_store
