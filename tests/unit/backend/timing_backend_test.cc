#include "backend/timing_backend.h"

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

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

TEST(TimingBackendTest, EveryOpKindHasItsOwnName) {
  std::set<std::string_view> names;
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    const std::string_view name = OpKindName(static_cast<OpKind>(k));
    EXPECT_NE(name, "?") << "kind " << k;
    EXPECT_TRUE(names.insert(name).second) << name;
  }
}

// A backend whose only behaviour is Allocate: what it returns shows that TimingBackend
// asked it rather than the default host allocation.
class AllocateOnlyBackend final : public Backend {
 public:
  std::string_view name() const override { return "allocate-only"; }
  bool uses_host_memory() const override { return false; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes, std::string_view what) override {
    last_bytes = bytes;
    last_what = std::string(what);
    return absl::ResourceExhaustedError("allocate-only: no memory");
  }
  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(std::span<const TensorView>,
                                                           std::span<const TensorView>) override {
    return absl::UnimplementedError("allocate-only");
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
  void WriteKvCache(const TensorView&, const TensorView&, std::span<const int64_t>, const TensorView&) override {}
  void PagedAttention(const TensorView&, const TensorView&, const PagedAttentionBatch&, float,
                      const TensorView&) override {}

  int64_t last_bytes = -1;
  std::string last_what;
};

TEST(TimingBackendTest, AllocateIsTheWrappedBackends) {
  AllocateOnlyBackend inner;
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

}  // namespace
}  // namespace kvmesh::backend
