// TimingBackend: a Backend decorator that forwards every op to another backend
// and adds up the wall time each kind of op takes, for profiling an engine step
// op by op (tests/bench/engine_step_bench) without touching the engine.
//
// The times are wall clock around each call, so they include the kernel's own
// thread team (its fork/join and imbalance), which is what a step pays. The CPU
// backends' ops are synchronous, so the time is the op's whole work; a backend
// that only enqueues (cuda) would need a device sync this decorator does not do.
//
// Besides time, four ops count the bytes they must stream, so a profile can set
// its times against the copy bandwidth: Linear the packed weight's num_bytes(),
// PagedAttention the K and V of every position each sequence attends to
// (sum of context_lens x 2 x Hkv x D x element size; host-readable spans only),
// CopyBlocks and SwapBlocks the bytes they copy (pairs x num_layers x block_bytes).
//
// What is not an op (Allocate, queue(), ReserveWorkspace, RecordError, TakeError) is
// forwarded untimed: the wrapped backend keeps the errors.
//
// Thread-safety: like the backend it wraps, called from one thread at a time;
// Totals()/Reset() from that same thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "backend/ops.h"

namespace kvmesh::backend {

// kEmbedding counts Embedding and EmbeddingShard; kBlockTables ScatterPairs and
// GatherTableRows.
enum class OpKind : int {
  kLinear,
  kEmbedding,
  kRmsNorm,
  kAddRmsNorm,
  kApplyRope,
  kSiluAndMul,
  kDenseAttention,
  kWriteKvCache,
  kPagedAttention,
  kCopyColumns,
  kGatherAddRows,
  kArgmaxRows,
  kCopyBlocks,
  kSwapBlocks,
  kBlockTables,
  kCount,
};

std::string_view OpKindName(OpKind kind);

struct OpTotals {
  int64_t calls = 0;
  int64_t nanoseconds = 0;
  // Bytes the op streams (Linear: weights; PagedAttention: K and V read; CopyBlocks,
  // SwapBlocks: bytes copied); 0 for the others.
  int64_t bytes = 0;
};

// K and V bytes PagedAttention reads for `batch` over a [num_blocks, 2, Hkv, B, D]
// `kv_cache` (every sequence's whole context, once). The spans must be host memory.
int64_t PagedAttentionKvBytes(const TensorView& kv_cache, const PagedAttentionBatch& batch);

class TimingBackend final : public Backend {
 public:
  // `inner` must outlive this backend.
  explicit TimingBackend(Backend& inner) : inner_(inner) {}

  std::string_view name() const override { return inner_.name(); }
  bool uses_host_memory() const override { return inner_.uses_host_memory(); }
  int num_host_threads() const override { return inner_.num_host_threads(); }
  absl::Status TakeError() override { return inner_.TakeError(); }
  void RecordError(absl::Status status) override { inner_.RecordError(std::move(status)); }
  void* queue() const override { return inner_.queue(); }
  absl::Status ReserveWorkspace(const WorkspaceLimits& limits) override { return inner_.ReserveWorkspace(limits); }
  const std::array<OpTotals, static_cast<int>(OpKind::kCount)>& Totals() const { return totals_; }
  void Reset() { totals_ = {}; }

  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView> parts,
                                                           std::span<const TensorView> biases) override {
    return inner_.PackLinear(parts, biases);
  }
  void Linear(const TensorView& x, const PackedLinear& w, const TensorView& out) override;
  void Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) override;
  void EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                      const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override;
  void ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                 std::span<const float> inv_freq) override;
  void SiluAndMul(const TensorView& gate_up, const TensorView& out) override;
  void DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      std::span<const int32_t> positions, float scale, const TensorView& out) override;
  void WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                    const TensorView& kv_cache) override;
  void PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch, float scale,
                      const TensorView& out) override;
  void CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                   int64_t width) override;
  void GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                     const TensorView& out) override;
  void ArgmaxRows(const TensorView& x, std::span<int32_t> out) override;
  void CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) override;
  void SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) override;
  void ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) override;
  void GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                       std::span<const int32_t> context_lens, int32_t block_size_tokens,
                       std::span<int32_t> out) override;
  // Not an op: forwarded untimed.
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes, std::string_view what) override {
    return inner_.Allocate(bytes, what);
  }

 private:
  template <typename Fn>
  void Timed(OpKind kind, Fn&& fn, int64_t bytes = 0);

  Backend& inner_;
  std::array<OpTotals, static_cast<int>(OpKind::kCount)> totals_{};
};

}  // namespace kvmesh::backend
