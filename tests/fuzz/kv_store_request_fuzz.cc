// The kv-store's request handling (libs/kv_store_server/kv_store_requests.h) on
// arbitrary wire bytes: a sequence of Lookup, PutIntent, Put, Get, Release, Events and Stats
// messages parsed from the input, some Put blocks made valid (the token and epoch of an
// earlier intent, a matching checksum) so that commits happen, and the clock moved
// between them so leases and intents expire. Every request is served or refused
// cleanly, and after each one the store's accounting holds: no more blocks and intents
// than slots, no more bytes than blocks of a slot, nothing leased beyond what is
// committed.
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "fuzz_util.h"
#include "kv/checksum.h"
#include "kv_store/block_store.h"
#include "kv_store_server/kv_store_requests.h"
#include "kvmesh/v1/kv_store.pb.h"

namespace {

constexpr int64_t kSlots = 8;
constexpr int64_t kSlotBytes = 64;
constexpr uint64_t kEpoch = 0xe90c;

void CheckInvariants(kvmesh::kv_store::BlockStore& store) {
  const kvmesh::kv_store::BlockStoreStats s = store.Stats();
  if (s.num_blocks < 0 || s.num_intents < 0 || s.num_blocks + s.num_intents > kSlots) __builtin_trap();
  if (s.num_bytes < 0 || s.num_bytes > s.num_blocks * kSlotBytes) __builtin_trap();
  if (s.num_leased_blocks < 0 || s.num_leased_blocks > s.num_blocks) __builtin_trap();
  if (s.hit_blocks > s.queried_blocks || s.epoch != kEpoch) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace kv = kvmesh::kv;
  namespace kv_store = kvmesh::kv_store;
  namespace v1 = kvmesh::v1;
  kvmesh::ManualClock clock;
  std::unique_ptr<kv_store::BlockStore> store = kv_store::BlockStore::Create({.capacity_blocks = kSlots,
                                                                              .slot_bytes = kSlotBytes,
                                                                              .lease_ms = 100,
                                                                              .max_lease_ms = 300,
                                                                              .intent_timeout_ms = 200,
                                                                              .epoch = kEpoch,
                                                                              .clock = &clock})
                                                    .value();
  kvmesh::fuzz::Input in(data, size);
  v1::KvPutIntentRequest last_intent_request;
  v1::KvPutIntentResponse last_intent;
  int aimed_puts = 0;
  for (int op = 0; op < 32 && !in.empty(); ++op) {
    const uint8_t kind = in.Take<uint8_t>();
    clock.Advance(absl::Milliseconds(in.Take<uint8_t>()));
    const std::string bytes = in.TakeLongString(4096);
    switch (kind % 7) {
      case 0: {
        v1::KvLookupRequest request;
        v1::KvLookupResponse response;
        if (request.ParseFromString(bytes)) (void)kv_store::HandleLookup(*store, request, &response);
        break;
      }
      case 1: {
        v1::KvPutIntentRequest request;
        if (request.ParseFromString(bytes)) {
          v1::KvPutIntentResponse response;
          if (kv_store::HandlePutIntent(*store, request, &response).ok()) {
            last_intent_request = request;
            last_intent = response;
          }
        }
        break;
      }
      case 2: {
        v1::KvPutBlock block;
        if (!block.ParseFromString(bytes)) break;
        // With the top bit of `kind`, aim at the next block of the last intent: its key,
        // token and epoch and a matching checksum, so that blocks commit (unless the
        // data's size or the intent's state say otherwise).
        if ((kind & 0x80) != 0 && last_intent.blocks_size() > 0) {
          const int i = aimed_puts++ % last_intent.blocks_size();
          block.set_epoch(last_intent.epoch());
          *block.mutable_key() = last_intent_request.keys(i);
          block.set_token(last_intent.blocks(i).token());
          block.set_checksum(kv::Checksum(
              {reinterpret_cast<const std::byte*>(block.data().data()), block.data().size()}));
        }
        (void)kv_store::HandlePutBlock(*store, block);
        break;
      }
      case 3: {
        v1::KvGetRequest request;
        if (!request.ParseFromString(bytes) || !kv_store::CheckGetRequest(*store, request).ok()) break;
        for (const v1::KvStoreKey& key : request.keys()) {
          v1::KvGetBlock block;
          if (!kv_store::ReadGetBlock(*store, key, &block).ok()) break;
          if (kv::Checksum({reinterpret_cast<const std::byte*>(block.data().data()), block.data().size()}) !=
              block.checksum()) {
            __builtin_trap();  // the store serves only what it verified
          }
        }
        kv_store::EndGet(*store, request);
        break;
      }
      case 4: {
        v1::KvReleaseRequest request;
        v1::KvReleaseResponse response;
        if (request.ParseFromString(bytes)) (void)kv_store::HandleRelease(*store, request, &response);
        break;
      }
      case 5: {
        v1::KvStoreEventsRequest request;
        v1::KvStoreEventsResponse response;
        if (!request.ParseFromString(bytes) || !kv_store::HandleEvents(*store, request, &response).ok()) break;
        // Never more than asked, and a snapshot page lists committed keys only.
        if (response.events_size() > request.max_events()) __builtin_trap();
        if (response.reset() && response.events_size() > store->Stats().num_blocks) __builtin_trap();
        break;
      }
      default: {
        v1::KvStoreStatsResponse response;
        kv_store::FillStats(*store, absl::ZeroDuration(), &response);
        break;
      }
    }
    CheckInvariants(*store);
  }
  return 0;
}
