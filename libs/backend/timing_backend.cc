#include "backend/timing_backend.h"

#include <chrono>

namespace kvmesh::backend {

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kLinear: return "Linear";
    case OpKind::kEmbedding: return "Embedding";
    case OpKind::kRmsNorm: return "RmsNorm";
    case OpKind::kAddRmsNorm: return "AddRmsNorm";
    case OpKind::kApplyRope: return "ApplyRope";
    case OpKind::kSiluAndMul: return "SiluAndMul";
    case OpKind::kDenseAttention: return "DenseAttention";
    case OpKind::kWriteKvCache: return "WriteKvCache";
    case OpKind::kPagedAttention: return "PagedAttention";
    case OpKind::kCopyColumns: return "CopyColumns";
    case OpKind::kGatherAddRows: return "GatherAddRows";
    case OpKind::kArgmaxRows: return "ArgmaxRows";
    case OpKind::kCopyBlocks: return "CopyBlocks";
    case OpKind::kSwapBlocks: return "SwapBlocks";
    case OpKind::kBlockTables: return "BlockTables";
    case OpKind::kCount: break;
  }
  return "?";
}

int64_t PagedAttentionKvBytes(const TensorView& kv_cache, const PagedAttentionBatch& batch) {
  // kv_cache: [num_blocks, 2, Hkv, B, D].
  const int64_t per_position = 2 * kv_cache.shape[2] * kv_cache.shape[4] * DTypeSize(kv_cache.dtype);
  int64_t positions = 0;
  for (int32_t len : batch.context_lens) positions += len;
  return positions * per_position;
}

namespace {

// The bytes CopyBlocks and SwapBlocks copy for `pairs` (only its length is read: the ids
// may be device memory).
int64_t BlockPairBytes(const Backend::BlockPool& pool, std::span<const int32_t> pairs) {
  return static_cast<int64_t>(pairs.size() / 2) * pool.num_layers * pool.block_bytes;
}

}  // namespace

template <typename Fn>
void TimingBackend::Timed(OpKind kind, Fn&& fn, int64_t bytes) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  OpTotals& t = totals_[static_cast<int>(kind)];
  ++t.calls;
  t.bytes += bytes;
  t.nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

void TimingBackend::Linear(const TensorView& x, const PackedLinear& w, const TensorView& out) {
  Timed(OpKind::kLinear, [&] { inner_.Linear(x, w, out); }, w.num_bytes());
}

void TimingBackend::Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) {
  Timed(OpKind::kEmbedding, [&] { inner_.Embedding(ids, table, out); });
}

void TimingBackend::EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                                   const TensorView& out) {
  Timed(OpKind::kEmbedding, [&] { inner_.EmbeddingShard(ids, table, first_id, out); });
}

void TimingBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  Timed(OpKind::kRmsNorm, [&] { inner_.RmsNorm(x, weight, eps, out); });
}

void TimingBackend::AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                               const TensorView& out) {
  Timed(OpKind::kAddRmsNorm, [&] { inner_.AddRmsNorm(residual, x, weight, eps, out); });
}

void TimingBackend::ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                              std::span<const float> inv_freq) {
  Timed(OpKind::kApplyRope, [&] { inner_.ApplyRope(q, k, positions, inv_freq); });
}

void TimingBackend::SiluAndMul(const TensorView& gate_up, const TensorView& out) {
  Timed(OpKind::kSiluAndMul, [&] { inner_.SiluAndMul(gate_up, out); });
}

void TimingBackend::DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                   std::span<const int32_t> positions, float scale, const TensorView& out) {
  Timed(OpKind::kDenseAttention, [&] { inner_.DenseAttention(q, k_cache, v_cache, positions, scale, out); });
}

void TimingBackend::WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                                 const TensorView& kv_cache) {
  Timed(OpKind::kWriteKvCache, [&] { inner_.WriteKvCache(k, v, slots, kv_cache); });
}

void TimingBackend::PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch,
                                   float scale, const TensorView& out) {
  const int64_t bytes = inner_.uses_host_memory() ? PagedAttentionKvBytes(kv_cache, batch) : 0;
  Timed(OpKind::kPagedAttention, [&] { inner_.PagedAttention(q, kv_cache, batch, scale, out); }, bytes);
}

void TimingBackend::CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                                int64_t width) {
  Timed(OpKind::kCopyColumns, [&] { inner_.CopyColumns(src, src_col, dst, dst_col, width); });
}

void TimingBackend::GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                                  const TensorView& out) {
  Timed(OpKind::kGatherAddRows, [&] { inner_.GatherAddRows(a, b, rows, out); });
}

void TimingBackend::ArgmaxRows(const TensorView& x, std::span<int32_t> out) {
  Timed(OpKind::kArgmaxRows, [&] { inner_.ArgmaxRows(x, out); });
}

void TimingBackend::CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) {
  Timed(OpKind::kCopyBlocks, [&] { inner_.CopyBlocks(pool, pairs); }, BlockPairBytes(pool, pairs));
}

void TimingBackend::SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) {
  Timed(OpKind::kSwapBlocks, [&] { inner_.SwapBlocks(src, dst, pairs); }, BlockPairBytes(src, pairs));
}

void TimingBackend::ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) {
  Timed(OpKind::kBlockTables, [&] { inner_.ScatterPairs(updates, array); });
}

void TimingBackend::GatherTableRows(std::span<const int32_t> rows, int64_t row_stride,
                                    std::span<const int32_t> rows_of, std::span<const int32_t> context_lens,
                                    int32_t block_size_tokens, std::span<int32_t> out) {
  Timed(OpKind::kBlockTables,
        [&] { inner_.GatherTableRows(rows, row_stride, rows_of, context_lens, block_size_tokens, out); });
}

}  // namespace kvmesh::backend
