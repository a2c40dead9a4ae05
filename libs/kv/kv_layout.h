// The physical layout of one KV pool, and host memory that holds one.
//
// A pool serves one layer group (today: all layers of the model) and is indexed by the
// BlockIds of a BlockPool. Layer-major, then block-major:
//
//   pool  = [num_layers][num_blocks][2 (K, V)][num_kv_heads][B x D]
//   K head of a block: [head_dim][block_size_tokens]  (dimension-major)
//   V head of a block: [block_size_tokens][head_dim]  (token-major)
//
// K is stored transposed within its block because attention scores take one dimension
// of many keys at a time (q.k for kLanes keys per vector, no horizontal sums), while
// P.V takes whole V rows; vLLM's CPU and GPU caches split K the same way. One layer's
// pool is the dense tensor [num_blocks, 2, Hkv, B, D] (the innermost B x D read as
// above) that paged attention reads, and one block of one layer is ONE contiguous byte range of
// BlockBytes() at BlockOffset(layer, block): the unit that later work transfers
// (prefill -> decode), offloads (device -> host -> disk) and quantizes (fp8/int8 with
// per-block scales, kept beside the pool). Token slot s = block * B + offset.
//
// Under tensor parallelism each rank's pool holds only its own KV heads:
// num_kv_heads here is the per-rank count. When there are more ranks than KV heads
// (MQA, small GQA) each head is held by kv_head_replication ranks, and the accounting
// says so: UniqueBytes() is the share of this pool no other rank duplicates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "kv/kv_types.h"

namespace kvmesh::kv {

struct KvLayoutOptions {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;  // per rank
  // Ranks holding a copy of each of this pool's KV heads (1 without TP or when the heads
  // split evenly). Accounting only: the pool's size does not depend on it.
  int32_t kv_head_replication = 1;
  int32_t head_dim = 0;
  int32_t block_size_tokens = kDefaultBlockSizeTokens;
  DType dtype = DType::kF32;  // element type of K and V
  // Size the pool by exactly one of these: a byte budget (rounded down to whole blocks
  // across all layers) or a block count.
  int64_t budget_bytes = 0;
  int32_t num_blocks = 0;
};

// Bytes of one block of one layer, K and V: 2 * num_kv_heads * block_size_tokens *
// head_dim * DTypeSize(dtype). 0 if a dimension is not positive or the size overflows.
int64_t KvBlockBytes(const KvLayoutOptions& shape);

// How many blocks (each spanning every layer) fit in `budget_bytes`; num_blocks and
// budget_bytes of `shape` are ignored. 0 if the shape is invalid or nothing fits;
// capped at INT32_MAX.
int32_t NumBlocksForBudget(const KvLayoutOptions& shape, int64_t budget_bytes);

// Offsets into a pool of the layout above. A small value; copy freely.
//
// Thread-safety: immutable after Create.
class KvLayout {
 public:
  // InvalidArgument if a dimension (or kv_head_replication) is not positive, the dtype is not a KV element type
  // (f32, bf16, f16, fp8e4m3, int8), both or neither of budget_bytes / num_blocks are
  // set, the budget cannot hold one block per layer (the message gives the numbers), or
  // the pool's size overflows int64.
  static absl::StatusOr<KvLayout> Create(const KvLayoutOptions& options);

  int32_t num_layers() const { return num_layers_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t head_dim() const { return head_dim_; }
  int32_t block_size_tokens() const { return block_size_tokens_; }
  int32_t num_blocks() const { return num_blocks_; }
  DType dtype() const { return dtype_; }
  int32_t kv_head_replication() const { return kv_head_replication_; }

  // One block of one layer, K and V.
  int64_t BlockBytes() const { return block_bytes_; }
  // One layer's pool: num_blocks * BlockBytes().
  int64_t LayerBytes() const { return static_cast<int64_t>(num_blocks_) * block_bytes_; }
  // The whole pool: num_layers * LayerBytes().
  int64_t TotalBytes() const { return static_cast<int64_t>(num_layers_) * LayerBytes(); }
  // TotalBytes() / kv_head_replication(): this pool's share of the group's distinct KV.
  int64_t UniqueBytes() const { return TotalBytes() / kv_head_replication_; }
  // KV bytes of one token across all layers (what a token costs the budget).
  int64_t BytesPerToken() const { return static_cast<int64_t>(num_layers_) * block_bytes_ / block_size_tokens_; }

  // Byte offset of `block` of `layer` in the pool. Both must be in range.
  int64_t BlockOffset(int32_t layer, BlockId block) const {
    return static_cast<int64_t>(layer) * LayerBytes() + static_cast<int64_t>(block.value) * block_bytes_;
  }
  // Byte offset of dimension 0 of token slot `slot` (block * B + offset), head `head`,
  // K (kv == 0) or V (kv == 1), in `layer`. Dimension c is c * B elements further for
  // K, c elements further for V.
  int64_t SlotOffset(int32_t layer, int32_t kv, int32_t head, int64_t slot) const;

 private:
  KvLayout() = default;

  int32_t num_layers_ = 0;
  int32_t num_kv_heads_ = 0;
  int32_t head_dim_ = 0;
  int32_t block_size_tokens_ = 0;
  int32_t num_blocks_ = 0;
  DType dtype_ = DType::kF32;
  int32_t kv_head_replication_ = 1;
  int64_t block_bytes_ = 0;
};

// One block's KV and the host range it is copied to or from (KvStorage::SwapOut/SwapIn).
struct KvHostCopy {
  BlockId block;
  std::byte* host = nullptr;
};

// Host memory holding one pool in the KvLayout above: 64-byte aligned, zero-filled.
// Device (and pinned host) pools come with the CUDA backend; they share the layout.
//
// Thread-safety: not thread-safe; the engine thread owns it. Concurrent reads of
// disjoint blocks are safe.
class KvStorage {
 public:
  // Errors of KvLayout::Create; ResourceExhausted if the memory cannot be allocated.
  static absl::StatusOr<std::unique_ptr<KvStorage>> Create(const KvLayoutOptions& options);

  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  const KvLayout& layout() const { return layout_; }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  int64_t size_bytes() const { return layout_.TotalBytes(); }

  // The bytes of `block` of `layer`; both must be in range.
  std::span<std::byte> BlockData(int32_t layer, BlockId block) {
    return {data_.get() + layout_.BlockOffset(layer, block), static_cast<size_t>(layout_.BlockBytes())};
  }
  std::span<const std::byte> BlockData(int32_t layer, BlockId block) const {
    return {data_.get() + layout_.BlockOffset(layer, block), static_cast<size_t>(layout_.BlockBytes())};
  }
  // Layer `layer`'s pool as [num_blocks, 2, num_kv_heads, block_size_tokens, head_dim].
  TensorView LayerView(int32_t layer);

  // Bytes of one block over every layer: what SwapOut / SwapIn move.
  int64_t SwapBytesPerBlock() const { return static_cast<int64_t>(layout_.num_layers()) * layout_.BlockBytes(); }
  // Copies each block's KV, every layer, to / from its `host` range (SwapBytesPerBlock()
  // bytes, layer-major: layer l at l * BlockBytes()), for the lower KV tiers. The copies
  // run as one pipeline of streaming copies (kv/streaming_copy.h) and are complete and
  // ordered when the call returns. InvalidArgument for a block out of range, before
  // anything is copied. SwapOut fills `checksums`, when not empty (one per copy), with
  // kv::Checksum of each host range: each layer slice is hashed right after its copy,
  // from the cache, so the host tier need not reread the block from DRAM. SwapIn does
  // the same with the host range it reads, so that a block coming back is verified by
  // the copy that brings it (a separate verify pass would read it from DRAM twice).
  // `num_threads` > 1 splits the copies into that many contiguous shares, each its own
  // pipeline on an OpenMP thread (the caller's team: the CPU backend's between ops).
  // Why: a step's copies run between the backend's parallel ops, where its other
  // threads would otherwise spin beside the one copying (figures: kv/host_copy_bound.h).
  absl::Status SwapOut(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums = {},
                       int num_threads = 1) const;
  absl::Status SwapIn(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums = {},
                      int num_threads = 1);
  absl::Status SwapOut(BlockId block, std::byte* host) const { return SwapOut({{KvHostCopy{block, host}}}); }
  absl::Status SwapIn(BlockId block, std::byte* host) { return SwapIn({{KvHostCopy{block, host}}}); }

  // Copies block `src` onto block `dst` in every layer (copy-on-write after a fork).
  // InvalidArgument for an id out of range; src == dst is a no-op.
  absl::Status CopyBlock(BlockId src, BlockId dst);

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  using Memory = std::unique_ptr<std::byte, FreeDeleter>;

  KvStorage(const KvLayout& layout, Memory data) : layout_(layout), data_(std::move(data)) {}
  // InvalidArgument for a block outside the pool, or checksums neither empty nor one per copy.
  absl::Status CheckSwapBlocks(std::span<const KvHostCopy> copies, std::span<const uint64_t> checksums,
                               const char* what) const;
  // One thread's share of SwapOut / SwapIn: a pipeline of copies, then its fence.
  void SwapOutShare(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums) const;
  void SwapInShare(std::span<const KvHostCopy> copies, std::span<uint64_t> checksums);

  const KvLayout layout_;
  Memory data_;  // from std::aligned_alloc
};

}  // namespace kvmesh::kv
