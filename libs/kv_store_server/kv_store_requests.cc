#include "kv_store_server/kv_store_requests.h"

#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kv_store/kv_store_wire.h"

namespace kvmesh::kv_store {
namespace {

std::vector<StoreKey> KeysOf(const google::protobuf::RepeatedPtrField<v1::KvStoreKey>& keys) {
  std::vector<StoreKey> out;
  out.reserve(static_cast<size_t>(keys.size()));
  for (const v1::KvStoreKey& key : keys) out.push_back(FromProto(key));
  return out;
}

// FailedPrecondition unless `epoch` is this store's. Lease ids and intent tokens are
// only meaningful within the epoch that issued them.
absl::Status CheckEpoch(const BlockStore& store, uint64_t epoch, const char* what) {
  if (epoch == store.epoch()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " of epoch ", epoch, ", but the store's epoch is ",
                                                    store.epoch(), ": it restarted; look up or reserve again"));
}

}  // namespace

absl::Status HandleLookup(BlockStore& store, const v1::KvLookupRequest& request, v1::KvLookupResponse* response) {
  KVMESH_RETURN_IF_ERROR(CheckKeyCount(request.keys_size(), "keys"));
  const std::vector<StoreKey> keys = KeysOf(request.keys());
  const LookupResult result = store.Lookup(keys);
  response->set_epoch(store.epoch());
  response->set_num_present(result.num_present);
  response->set_lease_id(result.lease.value);
  response->set_lease_ms(result.num_present > 0 ? absl::ToInt64Milliseconds(store.lease_length()) : 0);
  return absl::OkStatus();
}

absl::Status HandlePutIntent(BlockStore& store, const v1::KvPutIntentRequest& request,
                             v1::KvPutIntentResponse* response) {
  KVMESH_RETURN_IF_ERROR(CheckKeyCount(request.keys_size(), "keys"));
  const std::vector<StoreKey> keys = KeysOf(request.keys());
  KVMESH_ASSIGN_OR_RETURN(const PutIntentResult result, store.PutIntent(keys, request.block_bytes()));
  response->set_epoch(store.epoch());
  response->set_intent_deadline_ms(absl::ToInt64Milliseconds(store.intent_timeout()));
  for (const BlockIntent& b : result.blocks) {
    v1::KvPutIntentResponse::Block* out = response->add_blocks();
    out->set_outcome(ToProto(b.outcome));
    out->set_token(b.token);
  }
  return absl::OkStatus();
}

absl::Status HandlePutBlock(BlockStore& store, const v1::KvPutBlock& block, absl::Duration in_place_wait) {
  if (!block.has_key()) return absl::InvalidArgumentError("key: missing");
  if (block.token() == 0) return absl::InvalidArgumentError("token: missing (0); PutIntent hands one out");
  const std::string& data = block.data();
  if (block.in_place()) {
    if (!data.empty()) return absl::InvalidArgumentError("data: must be empty with in_place");
    KVMESH_RETURN_IF_ERROR(CheckEpoch(store, block.epoch(), "an intent"));
    return store.CommitInPlace(FromProto(block.key()), block.token(), block.checksum(), in_place_wait);
  }
  if (data.empty() || static_cast<int64_t>(data.size()) > store.slot_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: ", data.size(), " bytes; a block has 1 to ", store.slot_bytes()));
  }
  KVMESH_RETURN_IF_ERROR(CheckEpoch(store, block.epoch(), "an intent"));
  return store.Put(FromProto(block.key()), block.token(),
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size()),
                   block.checksum());
}

absl::Status CheckGetRequest(const BlockStore& store, const v1::KvGetRequest& request) {
  KVMESH_RETURN_IF_ERROR(CheckKeyCount(request.keys_size(), "keys"));
  if (request.lease_id() != 0 && request.epoch() == 0) {
    return absl::InvalidArgumentError("epoch: required with lease_id (the epoch of the lookup)");
  }
  if (request.release_lease() && request.lease_id() == 0) {
    return absl::InvalidArgumentError("release_lease: set without a lease_id");
  }
  if (static_cast<int64_t>(request.ucx_lease_descriptor().size()) > kMaxLeaseDescriptorBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ucx_lease_descriptor: ", request.ucx_lease_descriptor().size(),
                                                   " bytes; at most ", kMaxLeaseDescriptorBytes));
  }
  if (request.epoch() != 0) KVMESH_RETURN_IF_ERROR(CheckEpoch(store, request.epoch(), "a lookup"));
  return absl::OkStatus();
}

absl::Status ReadGetBlock(BlockStore& store, const v1::KvStoreKey& key, v1::KvGetBlock* block) {
  std::string* data = block->mutable_data();
  KVMESH_ASSIGN_OR_RETURN(const uint64_t checksum,
                          store.Read(FromProto(key), [data](std::span<const std::byte> bytes) {
                            data->assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
                          }));
  block->set_epoch(store.epoch());
  *block->mutable_key() = key;
  block->set_checksum(checksum);
  return absl::OkStatus();
}

void EndGet(BlockStore& store, const v1::KvGetRequest& request) {
  if (request.release_lease() && request.lease_id() != 0 && request.epoch() == store.epoch()) {
    store.Release(LeaseId{request.lease_id()});
  }
}

absl::Status HandleRelease(BlockStore& store, const v1::KvReleaseRequest& request, v1::KvReleaseResponse* response) {
  if (request.lease_id() == 0) return absl::InvalidArgumentError("lease_id: missing (0)");
  KVMESH_RETURN_IF_ERROR(CheckEpoch(store, request.epoch(), "a lease"));
  response->set_epoch(store.epoch());
  response->set_released(store.Release(LeaseId{request.lease_id()}));
  return absl::OkStatus();
}

absl::Status HandleEvents(BlockStore& store, const v1::KvStoreEventsRequest& request,
                          v1::KvStoreEventsResponse* response) {
  constexpr int32_t kMaxEvents = 65536;  // as Lookup's keys: one response stays ~2 MiB
  if (request.max_events() < 1 || request.max_events() > kMaxEvents) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_events: must be in [1, ", kMaxEvents, "], not ", request.max_events()));
  }
  if (request.snapshot_cursor() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot_cursor: negative (", request.snapshot_cursor(), ")"));
  }
  const StoreEventsPage page = store.ReadEvents(
      {.epoch = request.epoch(), .after = request.after_sequence(), .snapshot_cursor = request.snapshot_cursor()},
      static_cast<size_t>(request.max_events()));
  response->set_epoch(page.epoch);
  response->set_reset(page.reset);
  response->mutable_events()->Reserve(static_cast<int>(page.events.size()));
  for (const StoreEvent& event : page.events) {
    v1::KvStoreEvent* out = response->add_events();
    ToProto(event.key, out->mutable_key());
    out->set_removed(event.removed);
  }
  response->set_next_after_sequence(page.next.after);
  response->set_next_snapshot_cursor(page.next.snapshot_cursor);
  return absl::OkStatus();
}

void FillStats(BlockStore& store, absl::Duration uptime, v1::KvStoreStatsResponse* response) {
  const BlockStoreStats s = store.Stats();
  response->set_epoch(s.epoch);
  response->set_uptime_ms(absl::ToInt64Milliseconds(uptime));
  response->set_capacity_blocks(s.capacity_blocks);
  response->set_slot_bytes(s.slot_bytes);
  response->set_num_blocks(s.num_blocks);
  response->set_num_bytes(s.num_bytes);
  response->set_num_intents(s.num_intents);
  response->set_num_leases(s.num_leases);
  response->set_num_leased_blocks(s.num_leased_blocks);
  response->set_lookups(s.lookups);
  response->set_queried_blocks(s.queried_blocks);
  response->set_hit_blocks(s.hit_blocks);
  response->set_get_blocks(s.get_blocks);
  response->set_get_bytes(s.get_bytes);
  response->set_put_blocks(s.put_blocks);
  response->set_put_bytes(s.put_bytes);
  response->set_evictions(s.evictions);
  response->set_expired_intents(s.expired_intents);
  response->set_checksum_failures(s.checksum_failures);
}

}  // namespace kvmesh::kv_store
