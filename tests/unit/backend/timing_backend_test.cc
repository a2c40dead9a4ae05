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

}  // namespace
}  // namespace kvmesh::backend
