// ModelRunner: the boundary between the engine's bookkeeping (scheduler, KV
// manager) and the model math. The scheduler decides which tokens of which
// sequences run this step and where their KV lives; the runner computes them
// over the paged cache and returns logits for the sequences that asked.
//
// Thread-safety: not thread-safe; owned and called by the engine loop.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv/kv_layout.h"

namespace kvmesh::engine {

// A SequenceChunk::seq_id that names no kept table: the chunk carries its whole table.
inline constexpr int64_t kNoSeqId = -1;

// One sequence's share of a step: a prefill chunk or a single decode token.
//
// Its block table covers positions 0..start+len-1. A runner whose keeps_block_tables() is
// true may be sent only what changed since the previous step: the table is then the
// runner's kept table for seq_id with its first block_table_start entries left as they are
// and every later one replaced by block_table (so block_table_start == 0 sends the whole
// table: a new, resumed or otherwise rewritten sequence). Without a seq_id
// (kNoSeqId, the default) block_table_start is 0 and block_table is the whole table, kept
// for this step only.
struct SequenceChunk {
  std::vector<int32_t> token_ids;     // the tokens computed this step, in order
  int32_t start_position = 0;         // tokens of this sequence already in the KV cache
  std::vector<int32_t> block_table;   // entries block_table_start.. of the table (see above)
  bool compute_logits = false;        // logits of the chunk's last token are wanted
  // With compute_logits: only the greedy token is wanted (greedy sampling, no logprobs,
  // penalties or masks), so the runner returns it in ModelOutput::argmax_token_ids instead
  // of the logits row. Set only for runners whose returns_argmax() is true.
  bool argmax_only = false;
  // The logits of every token of the chunk are wanted, one row per token in order (the
  // prompt logprobs); with compute_logits the last row is also the sampling row. Never
  // with argmax_only. Set only for runners whose all_position_logits() is true.
  bool all_logits = false;
  // Stable across steps (the scheduler's KV id): which kept table the delta applies to.
  // NOTE: last, so that positional initializers of the fields above stay valid.
  int64_t seq_id = kNoSeqId;
  int32_t block_table_start = 0;  // > 0 only with a seq_id
};

// Copy every layer's KV of block `src` into block `dst` (copy-on-write) before the step.
struct KvBlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

// Moves one block's KV, every layer, between the runner's pool (tier 0) and host memory
// (the host tier's slot, kv/host_kv_tier.h) laid out layer-major: num_layers consecutive
// ranges of the pool layout's block bytes. Under tensor parallelism the slot holds every
// rank's heads: rank r's share (its own num_layers * block bytes) starts at
// r * that size. A CUDA runner moves them with kernels/swap_blocks through pinned memory.
struct KvBlockSwap {
  int32_t block = 0;          // in the runner's pool
  std::byte* host = nullptr;  // kv_swap_bytes_per_block() bytes, valid until Execute returns
};

// The shape of a KvBlockSwap's host range, which the disk tier records in each block's
// header (records of another shape are foreign): `num_layers` ranges of `block_bytes`
// of `dtype`. Under tensor parallelism every rank's layers, rank-major, so a TP=2 slot
// (2 * layers ranges of half the heads) never reads as a TP=1 one.
struct KvSlotShape {
  int32_t num_layers = 0;
  int64_t block_bytes = 0;
  int32_t dtype = 0;  // DType as an integer
};

struct ModelBatch {
  std::vector<SequenceChunk> chunks;
  // Execute's order within a step: swap_out (pool -> host: a block offloaded as it is
  // evicted may be reused by a chunk of this same step), then swap_in (host -> pool: a
  // prefix hit onboarded from a lower tier), then block_copies, then the chunks. A batch
  // may carry swaps and no chunks.
  std::vector<KvBlockSwap> swap_out;
  std::vector<KvBlockSwap> swap_in;
  // One per swap_in (or empty): kv::Checksum its host range must have, the host tier's
  // record. A runner whose verifies_swap_ins() is true hashes each range as it copies it
  // and, when any differs, runs nothing after the swaps (ModelOutput::swap_in_mismatch);
  // other runners ignore them (the host tier then verifies each hit before the copy).
  std::vector<uint64_t> swap_in_checksums;
  std::vector<KvBlockCopy> block_copies;
  // Sequences whose kept tables the runner drops before this batch's chunks are applied
  // (they ended, were preempted or otherwise lost their KV). A sequence may be released
  // and sent whole again in the same batch. Ids the runner does not keep are ignored.
  std::vector<int64_t> released_seq_ids;
  // Optional: Execute calls it once per layer, in layer order, on its own thread, as
  // soon as that layer's new KV of every chunk is in kv_rank_storages() (every rank's,
  // under TP) and before the next layer starts. It may read that layer's blocks (and must not
  // write any, nor call back into the runner). The engine streams a prefill's KV out
  // layer by layer through it while the later layers compute. NOTE: empty for ordinary
  // steps; a runner only tests it, so it costs nothing then. A runner whose
  // kv_rank_storages() mirror a device pool (CopyKvToHostMirror) calls it once the layer's
  // layer_kv_read_blocks are in the mirror, which may be while later layers run.
  std::function<void(int32_t layer)> on_layer_kv_written;
  // With on_layer_kv_written: the blocks it reads. A runner whose pool is not host memory
  // copies each layer of these into its host mirror before calling it for that layer.
  std::vector<int32_t> layer_kv_read_blocks;
};

struct ModelOutput {
  // [rows, vocab_size] f32, in chunk order: one row per chunk with compute_logits and not
  // argmax_only, except that a chunk with all_logits has one row per token.
  std::vector<float> logits;
  // One per chunk with compute_logits and argmax_only, in chunk order: the lowest id of
  // the largest logit (NaN never wins; +inf counts as the largest finite float, as the
  // sampler's greedy path reads it), or -1 when no logit is finite.
  std::vector<int32_t> argmax_token_ids;
  // Time the step spent on ModelBatch::swap_out and swap_in (the tiers' bandwidths).
  double swap_out_seconds = 0;
  double swap_in_seconds = 0;
  // One per ModelBatch::swap_out, when the runner hashed each host range as it copied
  // it (kv::Checksum, from the cache); empty when it did not (a TP rank writes only its
  // share; a device copy lands by DMA), and the host tier hashes the slot itself.
  std::vector<uint64_t> swap_out_checksums;
  // One per ModelBatch::swap_in when the runner hashed each host range as it copied it
  // (verifies_swap_ins()), else empty.
  std::vector<uint64_t> swap_in_checksums;
  // A swap-in's bytes differed from ModelBatch::swap_in_checksums: the step stopped after
  // its swaps (no block copy and no chunk ran; logits and argmax rows are empty), and
  // its sequences must be run again without the corrupt blocks.
  bool swap_in_mismatch = false;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t block_size_tokens() const = 0;
  virtual int32_t num_blocks() const = 0;
  // Runs one step: first every block copy of the batch, then the chunks (so a
  // copy's source may be reused by a chunk of the same step). InvalidArgument for
  // a malformed batch (token outside the vocabulary, block table too short, block
  // id out of range, a delta for a table the runner does not keep: BlockTables::Apply);
  // ResourceExhausted when a runner with a bounded number of kept tables has no room.
  virtual absl::StatusOr<ModelOutput> Execute(const ModelBatch& batch) = 0;
  // The host KV pool the runner computes over (block ids are the KV manager's), or
  // nullptr when it has none the engine may read and write directly (a fake, a device
  // pool). Prefill/decode disaggregation copies blocks in and out through it
  // (Engine::ImportKvBlock / ExportKvBlock) between steps, never during Execute.
  virtual kv::KvStorage* kv_storage() { return nullptr; }
  // Every tensor-parallel rank's host KV pool, in rank order: rank r's pool holds its own
  // KV heads (every layer) under the same block ids as every other rank's, so a prefill
  // -> decode transfer moves rank r's blocks into the peer's rank r (kv_handoff.h). One
  // entry, kv_storage(), for an unsharded runner; empty when it has none.
  virtual std::vector<kv::KvStorage*> kv_rank_storages() {
    kv::KvStorage* storage = kv_storage();
    return storage == nullptr ? std::vector<kv::KvStorage*>{} : std::vector<kv::KvStorage*>{storage};
  }
  // A runner whose pool is in device memory and that moves KV between workers exposes a
  // host mirror of it as kv_rank_storages(): the same layout and block ids, in pinned
  // memory that a transport reads and writes. These copy every layer of `blocks` between
  // the pool and the mirror, between steps: to the mirror before the transfer paths read
  // a prefill's blocks, from it once a remote prefill's blocks have landed and before any
  // step reads them. Complete when they return. InvalidArgument for a block outside the
  // pool, before anything is copied. No-ops (the default) where kv_rank_storages() are the
  // pools themselves.
  virtual absl::Status CopyKvToHostMirror(std::span<const int32_t> blocks) {
    (void)blocks;
    return absl::OkStatus();
  }
  virtual absl::Status CopyKvFromHostMirror(std::span<const int32_t> blocks) {
    (void)blocks;
    return absl::OkStatus();
  }
  // The layout of the pool the runner computes over (of each rank's, under TP), or
  // nullopt when it has none (a fake). What the workers agree on before moving KV.
  virtual std::optional<kv::KvLayout> kv_pool_layout() {
    const std::vector<kv::KvStorage*> ranks = kv_rank_storages();
    if (ranks.empty()) return std::nullopt;
    return ranks[0]->layout();
  }
  // Whether Execute honours SequenceChunk::argmax_only (a device runner then copies one
  // token id to the host instead of a vocabulary of logits, and skips the host's argmax).
  virtual bool returns_argmax() const { return false; }
  // Whether Execute honours SequenceChunk::all_logits (what prompt logprobs need).
  virtual bool all_position_logits() const { return false; }
  // Whether Execute keeps each seq_id's block table between steps (engine/block_tables.h),
  // so that chunks may carry only the entries that changed and ModelBatch::released_seq_ids
  // says when to forget one. A runner that says so must see every batch of its engine.
  virtual bool keeps_block_tables() const { return false; }
  // Whether Execute verifies ModelBatch::swap_in_checksums as it copies (see there).
  // Why only some: a whole slot's checksum needs one reader of all of it in order, which
  // a TP rank (its share) or a device copy (DMA) is not.
  virtual bool verifies_swap_ins() const { return false; }
  // Bytes of one block over every layer (and every TP rank): the size of a KvBlockSwap's
  // host range. 0 when the runner cannot swap blocks (then the engine runs no lower tier).
  virtual int64_t kv_swap_bytes_per_block() const { return 0; }
  // num_layers * block_bytes == kv_swap_bytes_per_block(); all 0 when that is 0.
  virtual KvSlotShape kv_slot_shape() const { return {}; }
};

}  // namespace kvmesh::engine
