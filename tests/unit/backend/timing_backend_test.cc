#include "backend/timing_backend.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace kvmesh::backend {
namespace {

TEST(TimingBackendTest, ForwardsEveryOpAndCountsItsCalls) {
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend timing(*ref);
  EXPECT_EQ(timing.name(), ref->name());
  std::vector<float> w = {1, 2, 3, 4, 5, 6};  // [N = 3, K = 2]
  const TensorView wv = TensorView::Contiguous(w.data(), DType::kF32, {3, 2});
  auto packed = timing.PackLinear({&wv, 1}, {});
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> x = {1, -1, 2, 0.5f};  // [T = 2, K = 2]
  std::vector<float> got(6), want(6);
  const TensorView xv = TensorView::Contiguous(x.data(), DType::kF32, {2, 2});
  timing.Linear(xv, **packed, TensorView::Contiguous(got.data(), DType::kF32, {2, 3}));
  timing.Linear(xv, **packed, TensorView::Contiguous(got.data(), DType::kF32, {2, 3}));
  ref->Linear(xv, **packed, TensorView::Contiguous(want.data(), DType::kF32, {2, 3}));
  EXPECT_EQ(got, want);
  std::vector<float> norm = {1, 1};
  timing.RmsNorm(xv, TensorView::Contiguous(norm.data(), DType::kF32, {2}), 1e-6f, xv);

  const auto& totals = timing.Totals();
  EXPECT_EQ(totals[static_cast<int>(OpKind::kLinear)].calls, 2);
  EXPECT_GT(totals[static_cast<int>(OpKind::kLinear)].nanoseconds, 0);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kRmsNorm)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kPagedAttention)].calls, 0);
  EXPECT_EQ(OpKindName(OpKind::kPagedAttention), "PagedAttention");
  timing.Reset();
  EXPECT_EQ(timing.Totals()[static_cast<int>(OpKind::kLinear)].calls, 0);
}

// The byte counts engine_step_bench sets against the copy bandwidth: Linear adds the
// packed weight's bytes per call, PagedAttention every attended position's K and V.
TEST(TimingBackendTest, CountsTheBytesLinearAndPagedAttentionStream) {
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend timing(*ref);
  std::vector<float> w(3 * 2, 1.0f);  // [N = 3, K = 2]
  const TensorView wv = TensorView::Contiguous(w.data(), DType::kF32, {3, 2});
  auto packed = timing.PackLinear({&wv, 1}, {});
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> x(2, 1.0f), y(3);
  timing.Linear(TensorView::Contiguous(x.data(), DType::kF32, {1, 2}), **packed,
                TensorView::Contiguous(y.data(), DType::kF32, {1, 3}));
  EXPECT_EQ(timing.Totals()[static_cast<int>(OpKind::kLinear)].bytes, (*packed)->num_bytes());

  // Two sequences of 5 and 3 positions over a [num_blocks 2, 2, Hkv 2, B 4, D 16] f32 pool.
  const int64_t hkv = 2, bs = 4, d = 16, h = 2;
  std::vector<float> cache(2 * 2 * hkv * bs * d, 0.5f);
  const TensorView kv = TensorView::Contiguous(cache.data(), DType::kF32, {2, 2, hkv, bs, d});
  const std::vector<int32_t> query_start = {0, 1, 2}, context_lens = {5, 3}, tables = {0, 1, 1, 0};
  const PagedAttentionBatch batch{query_start, context_lens, tables, 2};
  EXPECT_EQ(PagedAttentionKvBytes(kv, batch), (5 + 3) * 2 * hkv * d * 4);
  std::vector<float> q(2 * h * d, 0.1f), out(q.size());
  timing.PagedAttention(TensorView::Contiguous(q.data(), DType::kF32, {2, h, d}), kv, batch, 0.25f,
                        TensorView::Contiguous(out.data(), DType::kF32, {2, h, d}));
  EXPECT_EQ(timing.Totals()[static_cast<int>(OpKind::kPagedAttention)].bytes, (5 + 3) * 2 * hkv * d * 4);
  EXPECT_EQ(timing.Totals()[static_cast<int>(OpKind::kRmsNorm)].bytes, 0);
}

// The forward pass's data-movement ops and ArgmaxRows reach the wrapped backend (the same
// results as calling it) and are counted: EmbeddingShard as an embedding.
TEST(TimingBackendTest, ForwardsTheDataMovementOpsAndArgmax) {
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend timing(*ref);
  std::vector<float> table = {1, 2, 3, 4, 5, 6};  // [V = 3, E = 2], the ids 10..12 of a shard
  const TensorView tv = TensorView::Contiguous(table.data(), DType::kF32, {3, 2});
  const std::vector<int32_t> ids = {11, 2, 12};
  std::vector<float> got(6, -1), want(6, -2);
  timing.EmbeddingShard(ids, tv, 10, TensorView::Contiguous(got.data(), DType::kF32, {3, 2}));
  ref->EmbeddingShard(ids, tv, 10, TensorView::Contiguous(want.data(), DType::kF32, {3, 2}));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got, (std::vector<float>{3, 4, 0, 0, 5, 6}));

  std::vector<float> dst(6, 0), dst_want(6, 0);  // [T = 3, 2] <- column 1 of the table
  timing.CopyColumns(tv, 1, TensorView::Contiguous(dst.data(), DType::kF32, {3, 2}), 0, 1);
  ref->CopyColumns(tv, 1, TensorView::Contiguous(dst_want.data(), DType::kF32, {3, 2}), 0, 1);
  EXPECT_EQ(dst, dst_want);
  EXPECT_EQ(dst, (std::vector<float>{2, 0, 4, 0, 6, 0}));

  const std::vector<int32_t> rows = {2, 0};
  std::vector<float> sum(4), sum_want(4);
  timing.GatherAddRows(tv, tv, rows, TensorView::Contiguous(sum.data(), DType::kF32, {2, 2}));
  ref->GatherAddRows(tv, tv, rows, TensorView::Contiguous(sum_want.data(), DType::kF32, {2, 2}));
  EXPECT_EQ(sum, sum_want);
  EXPECT_EQ(sum, (std::vector<float>{10, 12, 2, 4}));

  std::vector<int32_t> best(3, -7), best_want(3, -8);
  timing.ArgmaxRows(tv, best);
  ref->ArgmaxRows(tv, best_want);
  EXPECT_EQ(best, best_want);
  EXPECT_EQ(best, (std::vector<int32_t>{1, 1, 1}));

  const auto& totals = timing.Totals();
  EXPECT_EQ(totals[static_cast<int>(OpKind::kEmbedding)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kCopyColumns)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kGatherAddRows)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kArgmaxRows)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kLinear)].calls, 0);
}

// The whole-block copies and the block-table ops reach the wrapped backend and are counted;
// the copies with the bytes they move (pairs x layers x block bytes).
TEST(TimingBackendTest, ForwardsTheBlockOpsAndCountsTheBytesCopied) {
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend timing(*ref);
  // [2 layers][3 blocks][4 bytes]: byte b of block k of layer l holds 16 l + 4 k + b.
  std::vector<std::byte> pool(24);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<std::byte>((i / 12) * 16 + i % 12);
  const Backend::BlockPool view{.data = pool.data(), .num_layers = 2, .layer_bytes = 12, .block_bytes = 4};
  const std::vector<int32_t> copy = {2, 0};
  timing.CopyBlocks(view, copy);
  auto block = [](const std::vector<std::byte>& bytes, int64_t first) {
    std::vector<int> b;
    for (int64_t i = first; i < first + 4; ++i) b.push_back(static_cast<int>(bytes[static_cast<size_t>(i)]));
    return b;
  };
  EXPECT_EQ(block(pool, 0), (std::vector<int>{8, 9, 10, 11}));
  EXPECT_EQ(block(pool, 12), (std::vector<int>{24, 25, 26, 27}));

  std::vector<std::byte> slot(8, std::byte{0xee});  // one block of each layer
  const Backend::BlockPool slot_view{.data = slot.data(), .num_layers = 2, .layer_bytes = 4, .block_bytes = 4};
  const std::vector<int32_t> offload = {1, 0};
  timing.SwapBlocks(view, slot_view, offload);
  EXPECT_EQ(block(slot, 0), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(block(slot, 4), (std::vector<int>{20, 21, 22, 23}));

  std::vector<int32_t> kept = {0, 0, 0, 0};  // two kept rows of stride 2
  const std::vector<int32_t> updates = {0, 7, 1, 8, 3, 9};
  timing.ScatterPairs(updates, kept);
  EXPECT_EQ(kept, (std::vector<int32_t>{7, 8, 0, 9}));
  const std::vector<int32_t> rows_of = {1, 0}, context_lens = {20, 5};
  std::vector<int32_t> table(6, -1), table_want(6, -2);
  timing.GatherTableRows(kept, 2, rows_of, context_lens, 16, table);
  ref->GatherTableRows(kept, 2, rows_of, context_lens, 16, table_want);
  EXPECT_EQ(table, table_want);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 9, 0, 7, 0, 0}));

  const auto& totals = timing.Totals();
  EXPECT_EQ(totals[static_cast<int>(OpKind::kCopyBlocks)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kCopyBlocks)].bytes, 1 * 2 * 4);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kSwapBlocks)].calls, 1);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kSwapBlocks)].bytes, 1 * 2 * 4);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kBlockTables)].calls, 2);
  EXPECT_EQ(totals[static_cast<int>(OpKind::kBlockTables)].bytes, 0);
}

// RecordError lands in the wrapped backend, whose TakeError (through the decorator or not)
// returns it; nothing of it is counted as an op.
TEST(TimingBackendTest, RecordErrorAndTakeErrorAreTheWrappedBackends) {
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend timing(*ref);
  timing.RecordError(absl::InternalError("a failed upload"));
  timing.RecordError(absl::InternalError("a later failure"));
  const absl::Status taken = ref->TakeError();
  EXPECT_EQ(taken.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(taken.message(), "a failed upload");
  EXPECT_TRUE(timing.TakeError().ok());
  timing.RecordError(absl::DataLossError("again"));
  EXPECT_EQ(timing.TakeError().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ref->TakeError().ok());
  for (const OpTotals& t : timing.Totals()) EXPECT_EQ(t.calls, 0);
}

TEST(TimingBackendTest, EveryOpKindHasItsOwnName) {
  std::set<std::string_view> names;
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    const std::string_view name = OpKindName(static_cast<OpKind>(k));
    EXPECT_NE(name, "?") << "kind " << k;
    EXPECT_TRUE(names.insert(name).second) << name;
  }
}

// A backend whose only behaviours are Allocate, queue() and ReserveWorkspace: what they
// return shows that TimingBackend asked it rather than the base class's defaults.
class FakeDeviceBackend final : public Backend {
 public:
  std::string_view name() const override { return "fake-device"; }
  bool uses_host_memory() const override { return false; }
  void* queue() const override { return const_cast<int*>(&queue_); }
  absl::Status ReserveWorkspace(const WorkspaceLimits& limits) override {
    last_max_tokens = limits.max_tokens;
    return absl::ResourceExhaustedError("fake-device: no workspace");
  }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes, std::string_view what) override {
    last_bytes = bytes;
    last_what = std::string(what);
    return absl::ResourceExhaustedError("fake-device: no memory");
  }
  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView>,
                                                           std::span<const TensorView>) override {
    return absl::UnimplementedError("fake-device");
  }
  void Linear(const TensorView&, const PackedLinear&, const TensorView&) override {}
  void Embedding(std::span<const int32_t>, const TensorView&, const TensorView&) override {}
  void EmbeddingShard(std::span<const int32_t>, const TensorView&, int64_t, const TensorView&) override {}
  void RmsNorm(const TensorView&, const TensorView&, float, const TensorView&) override {}
  void AddRmsNorm(const TensorView&, const TensorView&, const TensorView&, float, const TensorView&) override {}
  void ApplyRope(const TensorView&, const TensorView&, std::span<const int32_t>, std::span<const float>) override {}
  void SiluAndMul(const TensorView&, const TensorView&) override {}
  void DenseAttention(const TensorView&, const TensorView&, const TensorView&, std::span<const int32_t>, float,
                      const TensorView&) override {}
  void CopyColumns(const TensorView&, int64_t, const TensorView&, int64_t, int64_t) override {}
  void GatherAddRows(const TensorView&, const TensorView&, std::span<const int32_t>, const TensorView&) override {}
  void ArgmaxRows(const TensorView&, std::span<int32_t>) override {}
  void CopyBlocks(const BlockPool&, std::span<const int32_t>) override {}
  void SwapBlocks(const BlockPool&, const BlockPool&, std::span<const int32_t>) override {}
  void ScatterPairs(std::span<const int32_t>, std::span<int32_t>) override {}
  void GatherTableRows(std::span<const int32_t>, int64_t, std::span<const int32_t>, std::span<const int32_t>, int32_t,
                       std::span<int32_t>) override {}
  void WriteKvCache(const TensorView&, const TensorView&, std::span<const int64_t>, const TensorView&) override {}
  void PagedAttention(const TensorView&, const TensorView&, const PagedAttentionBatch&, float,
                      const TensorView&) override {}

  int64_t last_bytes = -1;
  std::string last_what;
  int64_t last_max_tokens = -1;

 private:
  const int queue_ = 0;  // its address is the queue
};

TEST(TimingBackendTest, AllocateIsTheWrappedBackends) {
  FakeDeviceBackend inner;
  TimingBackend timing(inner);
  EXPECT_FALSE(timing.uses_host_memory());
  EXPECT_EQ(timing.Allocate(4096, "the KV pool").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(inner.last_bytes, 4096);
  EXPECT_EQ(inner.last_what, "the KV pool");

  // Over a host backend: its 64-byte aligned host memory.
  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend host(*ref);
  absl::StatusOr<std::unique_ptr<Backend::Buffer>> buffer = host.Allocate(100, "logits");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->size_bytes(), 100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 64, 0u);
}

TEST(TimingBackendTest, QueueAndReserveWorkspaceAreTheWrappedBackends) {
  FakeDeviceBackend inner;
  TimingBackend timing(inner);
  EXPECT_EQ(timing.queue(), inner.queue());
  EXPECT_NE(timing.queue(), nullptr);
  EXPECT_EQ(timing.ReserveWorkspace({.max_tokens = 300}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(inner.last_max_tokens, 300);

  std::unique_ptr<Backend> ref = CreateReferenceBackend();
  TimingBackend host(*ref);
  EXPECT_EQ(host.queue(), nullptr);
  EXPECT_TRUE(host.ReserveWorkspace({.max_tokens = 300}).ok());
}

}  // namespace
}  // namespace kvmesh::backend
