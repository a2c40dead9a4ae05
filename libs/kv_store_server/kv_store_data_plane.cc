#include "kv_store_server/kv_store_data_plane.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kv/transport/kv_lease_descriptor.h"
#include "kv_store/kv_store_wire.h"
#include "kv_store/store_data_plane.h"

namespace kvmesh::kv_store {

absl::StatusOr<std::unique_ptr<KvStoreUcxPlane>> KvStoreUcxPlane::Create(BlockStore& store,
                                                                          const KvStoreUcxOptions& options) {
  KVMESH_ASSIGN_OR_RETURN(const kv::KvLayout layout,
                          StoreSlotLayout(store.stride_bytes(), static_cast<int32_t>(store.capacity_blocks())));
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<kv::UcxKvTransport> transport,
                          kv::UcxKvTransport::Create({.tls = options.tls,
                                                      .hello_timeout_ms = options.hello_timeout_ms,
                                                      .cross_memory_attach = options.cross_memory_attach,
                                                      .checksum_runs = false}));
  KVMESH_ASSIGN_OR_RETURN(const kv::KvPoolHandle pool, transport->RegisterPool(store.slot_memory(), layout));
  return std::unique_ptr<KvStoreUcxPlane>(new KvStoreUcxPlane(store, options, std::move(transport), pool));
}

KvStoreUcxPlane::KvStoreUcxPlane(BlockStore& store, const KvStoreUcxOptions& options,
                                 std::unique_ptr<kv::UcxKvTransport> transport, kv::KvPoolHandle pool)
    : store_(store), options_(options), transport_(std::move(transport)), pool_(pool) {
  for (int32_t i = 0; i < std::max(1, options_.push_threads); ++i) push_threads_.emplace_back([this] { PushLoop(); });
}

KvStoreUcxPlane::~KvStoreUcxPlane() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : push_threads_) t.join();
}

absl::StatusOr<std::string> KvStoreUcxPlane::OpenPutLease(std::span<const StoreKey> keys,
                                                          std::span<const uint64_t> tokens) {
  KVMESH_ASSIGN_OR_RETURN(std::vector<int32_t> slots, store_.LendIntents(keys, tokens));
  std::vector<kv::BlockId> ids;
  ids.reserve(slots.size());
  for (const int32_t slot : slots) ids.push_back(kv::BlockId{slot});
  auto landed = std::make_shared<std::atomic<bool>>(false);
  // NOTE: the slots go back only at on_released, when nothing can write into them any
  // more (a failed lease whose same-host writer may still write waits for its fence).
  absl::StatusOr<kv::KvLeaseGrant> grant = transport_->OpenLease(
      pool_,
      {.block_ids = std::move(ids),
       .on_released =
           [this, slots, landed] {
             store_.ReturnLent(slots, landed->load() ? BlockStore::LentOutcome::kLanded
                                                     : BlockStore::LentOutcome::kFailed);
           }},
      [landed](const absl::Status& status, const kv::KvTransferStats&) { landed->store(status.ok()); });
  if (!grant.ok()) {
    store_.ReturnLent(slots, BlockStore::LentOutcome::kUnused);
    return absl::InternalError(absl::StrCat("ucx data plane: lease refused: ", grant.status().message()));
  }
  return std::move(grant->descriptor);
}

void KvStoreUcxPlane::PushGet(std::vector<StoreKey> keys, std::string descriptor, GetDoneFn done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      jobs_.push_back({std::move(keys), std::move(descriptor), std::move(done)});
      return;
    }
  }
  done(absl::CancelledError("the kv-store is shutting down"), {});
}

void KvStoreUcxPlane::PushLoop() {
  for (;;) {
    GetJob job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](KvStoreUcxPlane* self) ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->stopping_ || !self->jobs_.empty(); },
          this));
      if (jobs_.empty()) return;  // stopping
      if (stopping_) {
        for (GetJob& j : jobs_) j.done(absl::CancelledError("the kv-store is shutting down"), {});
        jobs_.clear();
        return;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    RunGet(std::move(job));
  }
}

void KvStoreUcxPlane::RunGet(GetJob job) {
  // 1. The descriptor from the wire, checked before anything is held for it.
  absl::StatusOr<kv::KvLeaseDescriptor> lease = kv::DecodeKvLeaseDescriptor(job.descriptor);
  if (!lease.ok()) {
    job.done(absl::InvalidArgumentError(absl::StrCat("ucx_lease_descriptor: ", lease.status().message())), {});
    return;
  }
  if (lease->block_ids.size() != job.keys.size()) {
    job.done(absl::InvalidArgumentError(absl::StrCat("ucx_lease_descriptor: ", lease->block_ids.size(),
                                                     " destination blocks for ", job.keys.size(), " keys")),
             {});
    return;
  }
  if (lease->spec.block_bytes != block_bytes()) {
    job.done(absl::InvalidArgumentError(absl::StrCat("ucx_lease_descriptor: blocks of ", lease->spec.block_bytes,
                                                     " bytes; this store's data plane moves ", block_bytes())),
             {});
    return;
  }
  // A pid from the wire is not the store's to write into (KvStoreUcxOptions): the
  // reader pulls the blocks through UCX instead.
  if (!options_.cma_into_readers && lease->receiver_pid != 0) {
    lease->receiver_pid = 0;
    job.descriptor = kv::EncodeKvLeaseDescriptor(*lease);
  }
  // 2. Every block held (not evicted) until the push is done; all of them or none: a
  //    key that is missing, or not of the slot size, leaves the whole get to the stream.
  auto pinned = std::make_shared<std::vector<BlockStore::PinnedBlock>>();
  pinned->reserve(job.keys.size());
  const auto unpin = [this](const std::vector<BlockStore::PinnedBlock>& blocks) {
    for (const BlockStore::PinnedBlock& b : blocks) store_.EndRead(b.slot);
  };
  for (const StoreKey& key : job.keys) {
    absl::StatusOr<BlockStore::PinnedBlock> b = store_.BeginRead(key);
    absl::Status s = b.status();
    if (b.ok() && b->length != block_bytes()) {
      store_.EndRead(b->slot);
      s = absl::FailedPreconditionError(absl::StrCat("block ", key.ToHex(), " has ", b->length,
                                                     " bytes; the data plane moves whole slots only"));
    }
    if (!s.ok()) {
      unpin(*pinned);
      job.done(s, {});
      return;
    }
    pinned->push_back(*b);
  }
  // 3. One push: adjacent slots go as one run.
  absl::StatusOr<std::unique_ptr<kv::KvPush>> push = transport_->OpenPush(pool_, job.descriptor);
  if (!push.ok()) {
    unpin(*pinned);
    job.done(push.status(), {});
    return;
  }
  std::vector<kv::BlockId> src;
  src.reserve(pinned->size());
  for (const BlockStore::PinnedBlock& b : *pinned) src.push_back(kv::BlockId{b.slot});
  if (const absl::Status s = (*push)->PutLayer(0, 0, src); !s.ok()) (*push)->Cancel();
  // NOTE: the push may be dropped once Finish was called: the transport keeps its state
  // until the completion ran.
  (*push)->Finish([pinned, unpin, done = std::move(job.done)](const absl::Status& status,
                                                              const kv::KvTransferStats&) mutable {
    unpin(*pinned);
    std::vector<uint64_t> checksums;
    if (status.ok()) {
      checksums.reserve(pinned->size());
      for (const BlockStore::PinnedBlock& b : *pinned) checksums.push_back(b.checksum);
    }
    done(status, std::move(checksums));
  });
}

}  // namespace kvmesh::kv_store
