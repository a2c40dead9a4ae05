// The kv-store's request handling: each kvmesh.v1.KvStore request (or Put stream
// message) validated field by field and applied to a BlockStore. KvStoreService's
// reactors are these functions plus gRPC plumbing; the kv_store_request fuzzer
// (tests/fuzz) drives them with arbitrary messages.
//
// Every count, size, id and epoch from the wire is checked before the store sees it:
// InvalidArgument names the field (too many or no keys, a block size outside the slot
// size, a zero token or lease id, a lease id without its epoch); FailedPrecondition when
// an epoch differs from the store's (it restarted since that lease or intent). The
// store's own errors (block_store.h) pass through.
//
// Thread-safety: as BlockStore (thread-safe).
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kv_store/block_store.h"
#include "kvmesh/v1/kv_store.pb.h"

namespace kvmesh::kv_store {

absl::Status HandleLookup(BlockStore& store, const v1::KvLookupRequest& request, v1::KvLookupResponse* response);
absl::Status HandlePutIntent(BlockStore& store, const v1::KvPutIntentRequest& request,
                             v1::KvPutIntentResponse* response);
// One message of a Put stream: its block committed, or the error that ends the stream.
// An in_place block (no data: it was written over the UCX data plane) is committed by
// BlockStore::CommitInPlace, which waits up to `in_place_wait` for its slots to be
// returned by the data plane.
absl::Status HandlePutBlock(BlockStore& store, const v1::KvPutBlock& block,
                            absl::Duration in_place_wait = absl::ZeroDuration());
// Validates a Get before its stream starts (with its ucx_lease_descriptor's size; the
// data plane decodes and checks the rest).
absl::Status CheckGetRequest(const BlockStore& store, const v1::KvGetRequest& request);
// Fills `block` (epoch, key, checksum, data) with the committed block of `key`;
// NotFound when it is not committed.
absl::Status ReadGetBlock(BlockStore& store, const v1::KvStoreKey& key, v1::KvGetBlock* block);
// Ends a Get: releases its lease when it asked to. Call once, whatever the outcome.
void EndGet(BlockStore& store, const v1::KvGetRequest& request);
absl::Status HandleRelease(BlockStore& store, const v1::KvReleaseRequest& request, v1::KvReleaseResponse* response);
void FillStats(BlockStore& store, absl::Duration uptime, v1::KvStoreStatsResponse* response);
// Residency changes after the reader's cursor (BlockStore::ReadEvents). InvalidArgument
// for max_events outside [1, 65536] or a negative snapshot cursor.
absl::Status HandleEvents(BlockStore& store, const v1::KvStoreEventsRequest& request,
                          v1::KvStoreEventsResponse* response);

}  // namespace kvmesh::kv_store
