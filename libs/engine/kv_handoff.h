// The vocabulary of a prefill -> decode KV handoff between two Engines
// (docs/architecture.md §3, "Transfer between workers"): the lease a decode engine grants for a remote
// prefill. The types carry no transport; the decode and prefill workers move the bytes
// (in-process: Engine::ExportKvBlock -> Engine::ImportKvBlock).
//
// One handoff, as the workers drive it:
//   decode engine D                                   prefill engine P
//   lease = D.ReserveForRemotePrefill(request)
//     (blocks for the whole prompt allocated, the locally cached prefix reused)
//                                        ── request, lease ──▶
//                                                     P.AddPrefillOnlyRequest(request,
//                                                         lease.num_cached_tokens)
//                                                     P.Step() ... → PrefillResult
//   CheckKvBlockSpecsMatch(P's spec, lease.kv_spec)   (the sender checks)
//   for each TP rank r, layer, block i >= lease.num_cached_blocks():
//     D.ImportKvBlock(lease.transfer_id, r, layer, i,  P.ExportKvBlock(id, r, layer, i))
//                                                     P.ReleasePrefill(id)
//   D.CommitRemotePrefill(lease.transfer_id, first token (+ logprobs))
//   D.Step() ... decodes as usual
//
// Layered streaming (prefill side): AddPrefillOnlyRequest may take a KvLayerSink. The
// engine then hands it each layer's blocks as soon as the model runner has written that
// layer (ModelBatch::on_layer_kv_written) — every step of a chunked prefill sends the
// blocks its chunk completed — so the transport overlaps the later layers' compute. By
// the time the PrefillResult output is delivered, every (rank, layer, block >=
// num_skipped_blocks) has gone through the sink exactly once; the bytes are those
// ExportKvBlock would return after the prefill.
//
// Tensor parallelism: both engines' runners hold a block's KV as tp_size shares, one
// per rank's pool under the same block ids (ModelRunner::kv_rank_storages). A transfer
// moves rank r's share into the peer's rank r, so the two sides must have the same
// tp_size (the lease carries it; the sender checks).
//
// A lease ends in exactly one of: committed (CommitRemotePrefill), failed
// (FailRemotePrefill: the transfer failed; a retry takes a new lease), aborted
// (Engine::Abort of the request) or expired (EngineOptions::lease_timeout_ms, reclaimed
// in Step). Every ending but commit frees the blocks and ends the request with a final
// output (a lease whose transport writes the blocks itself keeps them quarantined until
// its writers are gone: Engine::ExpectDirectKvWrites); commit hands them to the running
// sequence. No block is stranded.
//
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/kv_block_spec.h"
#include "kv/kv_handoff_ledger.h"
#include "kv/kv_types.h"

namespace kvmesh::engine {

// Names one lease of the decode engine that granted it (kv/kv_handoff_ledger.h).
using KvTransferId = kv::KvTransferId;

// What the decode side grants a remote prefill: where to write the prompt's KV.
struct RemotePrefillLease {
  KvTransferId transfer_id;
  std::string request_id;
  // Destination blocks covering the whole prompt, in position order: block i holds
  // positions [i * B, (i + 1) * B). The first num_cached_blocks() are the decode side's
  // own prefix-cache hits: they are not to be sent (ImportKvBlock rejects them).
  std::vector<kv::BlockId> block_ids;
  // Leading prompt tokens whose KV the decode side has already (a multiple of B, below
  // the prompt length). Pass it to the prefill side as skip_leading_tokens.
  int32_t num_cached_tokens = 0;
  // The layout every sent block must have (one rank's; the sender checks it against its
  // own), and the ranks the decode side holds each block over.
  kv::KvBlockSpec kv_spec;
  int32_t tp_size = 1;
  // When the lease expires on the decode engine's clock (EngineOptions::now_ms);
  // INT64_MAX when leases do not expire.
  int64_t deadline_ms = 0;

  int32_t num_cached_blocks() const {
    return kv_spec.block_size_tokens > 0 ? num_cached_tokens / kv_spec.block_size_tokens : 0;
  }
  int32_t num_blocks() const { return static_cast<int32_t>(block_ids.size()); }
};

// Blocks [first_block_index, first_block_index + blocks.size()) of a streamed prefill
// (indices into PrefillResult::block_ids, all >= its num_skipped_blocks) for one layer
// of one TP rank (0 without TP), each the layout's block bytes. The spans point into
// that rank's KV storage: valid only during the sink call.
struct KvLayerBlocks {
  int32_t rank = 0;
  int32_t layer = 0;
  int32_t first_block_index = 0;
  std::span<const std::span<const std::byte>> blocks;
};

// Called on the engine thread in the middle of a step (between two layers): it must be
// quick (copy, queue) and must not call into the Engine.
using KvLayerSink = std::function<void(const KvLayerBlocks&)>;

}  // namespace kvmesh::engine
