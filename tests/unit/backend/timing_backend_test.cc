#include "backend/timing_backend.h"

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

}  // namespace
}  // namespace kvmesh::backend
