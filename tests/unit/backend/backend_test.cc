// Backends against the reference oracle: one parameterised suite runs every op
// of ops.h on seeded random inputs of awkward sizes for each CPU ISA the host
// has (amx, avx512, avx2; cases of an ISA the CPU lacks are skipped), with the tolerance stated
// per op. Plus: the oracle on hand-computed values, bitwise batch invariance of
// Linear, and PackLinear's error cases. The data-movement ops, ArgmaxRows and Allocate
// run on both backends against expectations written in the test (ArgmaxRows also
// against the host sampler's greedy token, on the CUDA argmax test's rows), and so do the
// whole-block copies (CopyBlocks, SwapBlocks), the kept block tables' ScatterPairs and
// GatherTableRows, and the host backends' RecordError / TakeError, queue() and
// ReserveWorkspace.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "argmax_edge_rows.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "gtest/gtest.h"

namespace kvmesh::backend {
namespace {

// An owning buffer and a contiguous view of it.
struct Tensor {
  std::vector<uint8_t> bytes;
  TensorView view;

  Tensor(DType dtype, std::initializer_list<int64_t> shape) {
    view = TensorView::Contiguous(nullptr, dtype, shape);
    bytes.resize(static_cast<size_t>(view.num_bytes()) + 64);
    view.data = bytes.data();
  }
  float* f32() { return view.data_as<float>(); }
  int64_t size() const { return view.num_elements(); }
  float At(int64_t i) const {
    switch (view.dtype) {
      case DType::kBF16:
        return Bf16ToF32(view.data_as<uint16_t>()[i]);
      case DType::kF16:
        return F16ToF32(view.data_as<uint16_t>()[i]);
      default:
        return view.data_as<float>()[i];
    }
  }
  void Set(int64_t i, float v) {
    switch (view.dtype) {
      case DType::kBF16:
        view.data_as<uint16_t>()[i] = F32ToBf16(v);
        break;
      case DType::kF16:
        view.data_as<uint16_t>()[i] = F32ToF16(v);
        break;
      default:
        view.data_as<float>()[i] = v;
    }
  }
};

Tensor Random(DType dtype, std::initializer_list<int64_t> shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(dtype, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t.Set(i, dist(rng));
  return t;
}

Tensor Copy(const Tensor& t) {
  Tensor c = t;
  c.view.data = c.bytes.data();
  return c;
}

// |a - b| <= atol + rtol * |b| for every element; reports the first failure.
void ExpectNear(const Tensor& got, const Tensor& want, float atol, float rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int failures = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const float g = got.At(i);
    const float w = want.At(i);
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      if (++failures <= 3) ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// ---- The oracle on hand-computed values. ----

TEST(ReferenceBackendTest, LinearMatchesHandComputedValues) {
  auto ref = CreateReferenceBackend();
  float w[] = {1, 2, 3, 4, 5, 6};  // [2, 3]
  float b[] = {0.5f, -1.0f};
  float x[] = {1, 0, -1, 2, 1, 0};  // [2, 3]
  TensorView wv = TensorView::Contiguous(w, DType::kF32, {2, 3});
  TensorView bv = TensorView::Contiguous(b, DType::kF32, {2});
  auto packed = ref->PackLinear({&wv, 1}, {&bv, 1}).value();
  float out[4];
  ref->Linear(TensorView::Contiguous(x, DType::kF32, {2, 3}), *packed,
              TensorView::Contiguous(out, DType::kF32, {2, 2}));
  EXPECT_FLOAT_EQ(out[0], 1 - 3 + 0.5f);
  EXPECT_FLOAT_EQ(out[1], 4 - 6 - 1.0f);
  EXPECT_FLOAT_EQ(out[2], 2 + 2 + 0.5f);
  EXPECT_FLOAT_EQ(out[3], 8 + 5 - 1.0f);
  EXPECT_EQ(packed->num_bytes(), 6 * 4 + 2 * 4);
}

TEST(ReferenceBackendTest, RmsNormRopeSiluAttentionHandValues) {
  auto ref = CreateReferenceBackend();
  float x[] = {3, 4};
  float wt[] = {1, 2};
  float out[2];
  ref->RmsNorm(TensorView::Contiguous(x, DType::kF32, {1, 2}), TensorView::Contiguous(wt, DType::kF32, {2}), 0.0f,
               TensorView::Contiguous(out, DType::kF32, {1, 2}));
  const float rms = std::sqrt(12.5f);
  EXPECT_NEAR(out[0], 3 / rms, 1e-6);
  EXPECT_NEAR(out[1], 8 / rms, 1e-6);

  // RoPE at position 1 with inv_freq 1: (x1, x2) -> (x1 cos1 - x2 sin1, x2 cos1 + x1 sin1).
  float q[] = {1, 0};
  float k[] = {0, 1};
  const int32_t pos[] = {1};
  const float inv_freq[] = {1.0f};
  ref->ApplyRope(TensorView::Contiguous(q, DType::kF32, {1, 1, 2}), TensorView::Contiguous(k, DType::kF32, {1, 1, 2}),
                 pos, inv_freq);
  EXPECT_NEAR(q[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(q[1], std::sin(1.0), 1e-7);
  EXPECT_NEAR(k[0], -std::sin(1.0), 1e-7);
  EXPECT_NEAR(k[1], std::cos(1.0), 1e-7);

  float gu[] = {1, 3};
  float s[1];
  ref->SiluAndMul(TensorView::Contiguous(gu, DType::kF32, {1, 2}), TensorView::Contiguous(s, DType::kF32, {1, 1}));
  EXPECT_NEAR(s[0], 3 / (1 + std::exp(-1.0)), 1e-6);

  // Two cached positions, equal keys: the output is the mean of the values.
  float aq[] = {1, 1};
  float ak[] = {1, 0, 1, 0};
  float av[] = {2, 4, 6, 8};
  float ao[2];
  const int32_t apos[] = {1};
  ref->DenseAttention(TensorView::Contiguous(aq, DType::kF32, {1, 1, 2}),
                      TensorView::Contiguous(ak, DType::kF32, {2, 1, 2}),
                      TensorView::Contiguous(av, DType::kF32, {2, 1, 2}), apos, 1.0f,
                      TensorView::Contiguous(ao, DType::kF32, {1, 1, 2}));
  EXPECT_NEAR(ao[0], 4, 1e-6);
  EXPECT_NEAR(ao[1], 6, 1e-6);
}

// ---- Reference vs CPU. ----

struct BackendCase {
  std::string isa;
  int num_threads;
};

class BackendVsReferenceTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    auto backend = CreateCpuBackend({.num_threads = GetParam().num_threads, .isa = GetParam().isa});
    if (!backend.ok()) {
      ASSERT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
      GTEST_SKIP() << "CPU lacks " << GetParam().isa << ": " << backend.status();
    }
    backend_ = std::move(backend).value();
    ref_ = CreateReferenceBackend();
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> ref_;
  std::mt19937 rng_{12345};
};

TEST_P(BackendVsReferenceTest, NameNamesIsa) { EXPECT_EQ(backend_->name(), "cpu-" + GetParam().isa); }

// Tolerance: every output is one f32 FMA chain over K, so its error is at most
// ~K * 2^-24 * sum_k |x_k w_k| (+ the bias add): checked per element. On AMX,
// bf16 weights: x = t0 + t1 + t2 (+ r, |r| <= 2^-24 |x|), one f32 accumulation of
// 3K exact products, so (3K + 2 + 2) * 2^-24 * sum |x w|.
TEST_P(BackendVsReferenceTest, LinearMatchesReferenceWithinFmaChainBound) {
  struct Shape {
    std::vector<int64_t> n_parts;
    int64_t k;
  };
  const std::vector<Shape> shapes = {{{45}, 37}, {{77}, 100}, {{33, 17, 17}, 513}, {{130}, 16}, {{1}, 1}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : shapes) {
      for (bool with_bias : {false, true}) {
        std::vector<Tensor> parts;
        std::vector<Tensor> biases;
        int64_t n = 0;
        for (int64_t ni : shape.n_parts) {
          parts.push_back(Random(dtype, {ni, shape.k}, rng_));
          if (with_bias) biases.push_back(Random(dtype == DType::kF16 ? DType::kBF16 : DType::kF32, {ni}, rng_));
          n += ni;
        }
        std::vector<TensorView> part_views;
        std::vector<TensorView> bias_views;
        for (auto& p : parts) part_views.push_back(p.view);
        for (auto& b : biases) bias_views.push_back(b.view);
        auto ref_w = ref_->PackLinear(part_views, bias_views).value();
        auto got_w = backend_->PackLinear(part_views, bias_views).value();
        EXPECT_EQ(got_w->out_features(), n);
        EXPECT_EQ(got_w->in_features(), shape.k);
        EXPECT_EQ(got_w->dtype(), dtype == DType::kBF16 ? DType::kBF16 : DType::kF32);
        EXPECT_GE(got_w->num_bytes(), n * shape.k * (dtype == DType::kBF16 ? 2 : 4));
        const bool amx_split = GetParam().isa == "amx" && dtype == DType::kBF16;
        for (int64_t m : {1, 3, 8, 9, 17, 257}) {
          const std::string what = std::string(DTypeName(dtype)) + " M=" + std::to_string(m) +
                                   " N=" + std::to_string(n) + " K=" + std::to_string(shape.k) +
                                   (with_bias ? " bias" : "");
          Tensor x = Random(DType::kF32, {m, shape.k}, rng_);
          Tensor want(DType::kF32, {m, n});
          Tensor got(DType::kF32, {m, n});
          ref_->Linear(x.view, *ref_w, want.view);
          backend_->Linear(x.view, *got_w, got.view);
          // Per-element bound from sum |x w|.
          int failures = 0;
          for (int64_t t = 0; t < m; ++t) {
            int64_t row0 = 0;
            for (size_t p = 0; p < parts.size(); ++p) {
              for (int64_t r = 0; r < shape.n_parts[p]; ++r) {
                double mag = with_bias ? std::fabs(biases[p].At(r)) : 0.0;
                for (int64_t c = 0; c < shape.k; ++c)
                  mag += std::fabs(x.At(t * shape.k + c) * parts[p].At(r * shape.k + c));
                const double bound = (shape.k + (amx_split ? 2 * shape.k + 4 : 2)) * std::ldexp(1.0, -24) * mag + 1e-30;
                const int64_t i = t * n + row0 + r;
                if (!(std::fabs(got.At(i) - want.At(i)) <= bound) && ++failures <= 3) {
                  ADD_FAILURE() << what << " [" << t << ", " << row0 + r << "]: got " << got.At(i) << ", want "
                                << want.At(i) << ", bound " << bound;
                }
              }
              row0 += shape.n_parts[p];
            }
          }
          EXPECT_EQ(failures, 0) << what;
        }
      }
    }
  }
}

// A row's result is bitwise the same whatever the batch size, its position in
// the batch and the thread count.
TEST_P(BackendVsReferenceTest, LinearIsBatchInvariantBitwise) {
  auto one_thread = CreateCpuBackend({.num_threads = 1, .isa = GetParam().isa}).value();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const int64_t k = 203;
    const int64_t n = 150;
    Tensor w = Random(dtype, {n, k}, rng_);
    Tensor b = Random(DType::kF32, {n}, rng_);
    auto packed = backend_->PackLinear({&w.view, 1}, {&b.view, 1}).value();
    const int64_t total = 300;
    Tensor x = Random(DType::kF32, {total, k}, rng_);
    Tensor full(DType::kF32, {total, n});
    backend_->Linear(x.view, *packed, full.view);
    for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 24, 31, 33, 64, 257}) {
      for (int64_t offset : {int64_t{0}, int64_t{5}, total - m}) {
        Backend* which = (m % 2 == 0) ? one_thread.get() : backend_.get();
        TensorView xs = TensorView::Contiguous(x.f32() + offset * k, DType::kF32, {m, k});
        Tensor part(DType::kF32, {m, n});
        which->Linear(xs, *packed, part.view);
        ASSERT_EQ(std::memcmp(part.f32(), full.f32() + offset * n, static_cast<size_t>(m * n) * 4), 0)
            << DTypeName(dtype) << " M=" << m << " offset=" << offset;
      }
    }
  }
}

// The bf16 compute mode (CpuBackendOptions::compute_dtype): weights packed as bf16
// (f32 and f16 rounded), each activation rounded to bf16, the exact products summed in
// f32. Checked against those products summed in double: one f32 accumulation of K
// terms (pairs of them on AMX), so (K + 2) * 2^-24 * sum |bf16(x) bf16(w)| (+ the bias).
TEST_P(BackendVsReferenceTest, Bf16ComputeModeLinearIsTheBf16ProductsSummedInF32) {
  auto bf16 = CreateCpuBackend({.num_threads = GetParam().num_threads, .isa = GetParam().isa,
                                .compute_dtype = DType::kBF16})
                  .value();
  EXPECT_EQ(bf16->name(), "cpu-" + GetParam().isa + "-bf16");
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t k : {int64_t{37}, int64_t{513}}) {
      const int64_t n = 77;
      Tensor w = Random(dtype, {n, k}, rng_);
      Tensor b = Random(DType::kF32, {n}, rng_);
      auto packed = bf16->PackLinear({&w.view, 1}, {&b.view, 1}).value();
      EXPECT_EQ(packed->dtype(), DType::kBF16) << DTypeName(dtype);
      auto exact = backend_->PackLinear({&w.view, 1}, {&b.view, 1}).value();
      for (int64_t m : {1, 9, 33}) {
        const std::string what =
            std::string(DTypeName(dtype)) + " M=" + std::to_string(m) + " K=" + std::to_string(k);
        Tensor x = Random(DType::kF32, {m, k}, rng_);
        Tensor got(DType::kF32, {m, n});
        Tensor f32_mode(DType::kF32, {m, n});
        bf16->Linear(x.view, *packed, got.view);
        backend_->Linear(x.view, *exact, f32_mode.view);
        int failures = 0;
        int differ_from_f32_mode = 0;
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t r = 0; r < n; ++r) {
            double want = b.At(r);
            double mag = std::fabs(b.At(r));
            for (int64_t c = 0; c < k; ++c) {
              const double p = static_cast<double>(RoundToBf16(x.At(t * k + c))) * RoundToBf16(w.At(r * k + c));
              want += p;
              mag += std::fabs(p);
            }
            const double bound = (k + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
            const float g = got.At(t * n + r);
            differ_from_f32_mode += g != f32_mode.At(t * n + r);
            if (!(std::fabs(g - want) <= bound) && ++failures <= 3) {
              ADD_FAILURE() << what << " [" << t << ", " << r << "]: got " << g << ", want " << want << ", bound "
                            << bound;
            }
          }
        }
        EXPECT_EQ(failures, 0) << what;
        // Rounding x to bf16 changes sums: the mode is really on.
        EXPECT_GT(differ_from_f32_mode, m * n / 2) << what;
      }
    }
  }
}

TEST_P(BackendVsReferenceTest, Bf16ComputeModeLinearIsBatchInvariantBitwise) {
  auto bf16 = CreateCpuBackend({.num_threads = GetParam().num_threads, .isa = GetParam().isa,
                                .compute_dtype = DType::kBF16})
                  .value();
  auto one_thread = CreateCpuBackend({.num_threads = 1, .isa = GetParam().isa, .compute_dtype = DType::kBF16}).value();
  const int64_t k = 203;
  const int64_t n = 150;
  Tensor w = Random(DType::kBF16, {n, k}, rng_);
  auto packed = bf16->PackLinear({&w.view, 1}, {}).value();
  const int64_t total = 300;
  Tensor x = Random(DType::kF32, {total, k}, rng_);
  Tensor full(DType::kF32, {total, n});
  bf16->Linear(x.view, *packed, full.view);
  for (int64_t m : {1, 2, 3, 8, 9, 16, 17, 31, 33, 64, 257}) {
    for (int64_t offset : {int64_t{0}, int64_t{5}, total - m}) {
      Backend* which = (m % 2 == 0) ? one_thread.get() : bf16.get();
      TensorView xs = TensorView::Contiguous(x.f32() + offset * k, DType::kF32, {m, k});
      Tensor part(DType::kF32, {m, n});
      which->Linear(xs, *packed, part.view);
      ASSERT_EQ(std::memcmp(part.f32(), full.f32() + offset * n, static_cast<size_t>(m * n) * 4), 0)
          << "M=" << m << " offset=" << offset;
    }
  }
}

TEST_P(BackendVsReferenceTest, PackLinearRejectsMismatchedArguments) {
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    Tensor a = Random(DType::kBF16, {8, 16}, rng_);
    Tensor b_other_k = Random(DType::kBF16, {8, 17}, rng_);
    Tensor c_f32 = Random(DType::kF32, {8, 16}, rng_);
    Tensor bias8 = Random(DType::kF32, {8}, rng_);
    Tensor bias7 = Random(DType::kF32, {7}, rng_);
    Tensor ints(DType::kInt32, {8, 16});
    Tensor rank1 = Random(DType::kBF16, {16}, rng_);
    auto pack = [&](std::vector<TensorView> parts, std::vector<TensorView> biases) {
      return backend->PackLinear(parts, biases).status().code();
    };
    const auto kInvalid = absl::StatusCode::kInvalidArgument;
    EXPECT_EQ(pack({a.view, b_other_k.view}, {}), kInvalid) << backend->name() << " mismatched K";
    EXPECT_EQ(pack({a.view, c_f32.view}, {}), kInvalid) << backend->name() << " mixed dtypes";
    EXPECT_EQ(pack({a.view}, {bias7.view}), kInvalid) << backend->name() << " bias length";
    EXPECT_EQ(pack({a.view, a.view}, {bias8.view}), kInvalid) << backend->name() << " bias count";
    EXPECT_EQ(pack({ints.view}, {}), kInvalid) << backend->name() << " int32 weight";
    EXPECT_EQ(pack({rank1.view}, {}), kInvalid) << backend->name() << " rank-1 weight";
    EXPECT_EQ(pack({}, {}), kInvalid) << backend->name() << " no parts";
    EXPECT_TRUE(
        backend->PackLinear(std::vector<TensorView>{a.view, a.view}, std::vector<TensorView>{bias8.view, bias8.view})
            .ok());
  }
}

// Widening is exact: bitwise equal.
TEST_P(BackendVsReferenceTest, EmbeddingMatchesExactly) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor table = Random(dtype, {50, 45}, rng_);
    std::vector<int32_t> ids = {0, 49, 3, 3, 17, 1, 48, 20, 9, 11, 30, 31, 2, 44, 5, 6, 7};
    const int64_t t = static_cast<int64_t>(ids.size());
    Tensor want(DType::kF32, {t, 45});
    Tensor got(DType::kF32, {t, 45});
    ref_->Embedding(ids, table.view, want.view);
    backend_->Embedding(ids, table.view, got.view);
    ExpectNear(got, want, 0.0f, 0.0f, std::string("embedding ") + std::string(DTypeName(dtype)));
  }
}

// f32 sum of squares vs f64: relative 2e-6.
TEST_P(BackendVsReferenceTest, RmsNormAndAddRmsNormMatchWithinRelative2e6) {
  for (DType wdtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t t : {1, 3, 17, 257}) {
      for (int64_t e : {45, 512, 1000}) {
        const std::string what = std::string(DTypeName(wdtype)) + " T=" + std::to_string(t) + " E=" + std::to_string(e);
        Tensor x = Random(DType::kF32, {t, e}, rng_, -3.0f, 3.0f);
        Tensor w = Random(wdtype, {e}, rng_, 0.5f, 1.5f);
        Tensor want(DType::kF32, {t, e});
        Tensor got(DType::kF32, {t, e});
        ref_->RmsNorm(x.view, w.view, 1e-6f, want.view);
        backend_->RmsNorm(x.view, w.view, 1e-6f, got.view);
        ExpectNear(got, want, 1e-7f, 2e-6f, "RmsNorm " + what);

        Tensor res_ref = Random(DType::kF32, {t, e}, rng_, -3.0f, 3.0f);
        Tensor res_got = Copy(res_ref);
        ref_->AddRmsNorm(res_ref.view, x.view, w.view, 1e-5f, want.view);
        backend_->AddRmsNorm(res_got.view, x.view, w.view, 1e-5f, got.view);
        ExpectNear(res_got, res_ref, 0.0f, 0.0f, "AddRmsNorm residual " + what);
        ExpectNear(got, want, 1e-7f, 2e-6f, "AddRmsNorm " + what);
        // In place: out aliases x.
        Tensor inplace = Copy(x);
        backend_->RmsNorm(inplace.view, w.view, 1e-6f, inplace.view);
        ref_->RmsNorm(x.view, w.view, 1e-6f, want.view);
        ExpectNear(inplace, want, 1e-7f, 2e-6f, "RmsNorm in place " + what);
      }
    }
  }
}

// cos/sin in f32 of the same f32 angle: within 1 ulp each, so |diff| <= 4e-7 * |x|max.
TEST_P(BackendVsReferenceTest, ApplyRopeMatchesAtLongPositions) {
  for (int64_t d : {64, 128, 80}) {
    for (auto [h, hkv] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {8, 2}, {16, 2}}) {
      const int64_t t = 19;
      std::vector<float> inv_freq(static_cast<size_t>(d / 2));
      for (int64_t i = 0; i < d / 2; ++i) {
        inv_freq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(d));
      }
      std::vector<int32_t> positions(static_cast<size_t>(t));
      std::uniform_int_distribution<int32_t> pos_dist(0, 32767);
      for (auto& p : positions) p = pos_dist(rng_);
      positions[0] = 0;
      positions[1] = 2049;
      Tensor q = Random(DType::kF32, {t, h, d}, rng_);
      Tensor k = Random(DType::kF32, {t, hkv, d}, rng_);
      Tensor q2 = Copy(q);
      Tensor k2 = Copy(k);
      ref_->ApplyRope(q.view, k.view, positions, inv_freq);
      backend_->ApplyRope(q2.view, k2.view, positions, inv_freq);
      const std::string what = "D=" + std::to_string(d) + " H=" + std::to_string(h) + " Hkv=" + std::to_string(hkv);
      ExpectNear(q2, q, 5e-7f, 0.0f, "rope q " + what);
      ExpectNear(k2, k, 5e-7f, 0.0f, "rope k " + what);
    }
  }
}

// Polynomial exp: relative 1e-6 (+ tiny absolute for outputs near 0).
TEST_P(BackendVsReferenceTest, SiluAndMulMatchesWithinRelative1e6) {
  for (int64_t t : {1, 3, 17}) {
    for (int64_t inter : {45, 1408}) {
      Tensor gu = Random(DType::kF32, {t, 2 * inter}, rng_, -12.0f, 12.0f);
      gu.Set(0, -100.0f);
      gu.Set(1, 100.0f);
      gu.Set(2, 0.0f);
      Tensor want(DType::kF32, {t, inter});
      Tensor got(DType::kF32, {t, inter});
      ref_->SiluAndMul(gu.view, want.view);
      backend_->SiluAndMul(gu.view, got.view);
      ExpectNear(got, want, 1e-12f, 1e-6f, "silu T=" + std::to_string(t) + " I=" + std::to_string(inter));
    }
  }
}

// f32 online softmax vs f64: absolute 2e-6 on outputs of magnitude <= 1.
TEST_P(BackendVsReferenceTest, DenseAttentionMatchesForDecodePrefillAndChunks) {
  struct Case {
    int64_t t;
    int64_t s;
    int64_t first_position;
  };
  const std::vector<Case> cases = {{1, 1, 0}, {1, 37, 36}, {1, 300, 299}, {37, 37, 0}, {20, 300, 280}, {3, 129, 126}};
  for (int64_t d : {64, 128}) {
    for (auto [h, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {16, 2}, {32, 1}}) {
      for (const Case& c : cases) {
        Tensor q = Random(DType::kF32, {c.t, h, d}, rng_, -2.0f, 2.0f);
        Tensor k = Random(DType::kF32, {c.s, hkv, d}, rng_, -2.0f, 2.0f);
        Tensor v = Random(DType::kF32, {c.s, hkv, d}, rng_);
        std::vector<int32_t> positions(static_cast<size_t>(c.t));
        for (int64_t i = 0; i < c.t; ++i) positions[i] = static_cast<int32_t>(c.first_position + i);
        Tensor want(DType::kF32, {c.t, h, d});
        Tensor got(DType::kF32, {c.t, h, d});
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        ref_->DenseAttention(q.view, k.view, v.view, positions, scale, want.view);
        backend_->DenseAttention(q.view, k.view, v.view, positions, scale, got.view);
        ExpectNear(got, want, 2e-6f, 0.0f,
                   "attention D=" + std::to_string(d) + " H=" + std::to_string(h) + " Hkv=" + std::to_string(hkv) +
                       " T=" + std::to_string(c.t) + " S=" + std::to_string(c.s));
      }
    }
  }
}

// ---- The data-movement ops and ArgmaxRows: the CPU backend and the oracle alike, against
// expectations written here. Copies and sums are bitwise (ops.h: the inputs' bits). ----

// Bits of a float, so that +0 and -0 (and NaN payloads) count as different.
uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Every element of `got` (f32) bitwise equal to `want`; reports the first few that differ.
void ExpectBitwise(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size())) << what;
  int failures = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    if (Bits(got.At(i)) != Bits(want[static_cast<size_t>(i)]) && ++failures <= 3) {
      ADD_FAILURE() << what << " element " << i << ": got " << got.At(i) << ", want " << want[static_cast<size_t>(i)];
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// A tensor whose every element is NaN, so that an element an op leaves unwritten shows.
Tensor Poisoned(std::initializer_list<int64_t> shape) {
  Tensor t(DType::kF32, shape);
  for (int64_t i = 0; i < t.size(); ++i) t.Set(i, std::numeric_limits<float>::quiet_NaN());
  return t;
}

// Rows first_id .. first_id + rows - 1 of a [V, E] table, as the shard a rank holds.
TensorView ShardOf(const Tensor& table, int64_t first_id, int64_t rows) {
  TensorView shard = table.view;
  shard.data = const_cast<uint8_t*>(table.bytes.data()) + first_id * table.view.strides[0] * DTypeSize(table.view.dtype);
  shard.shape[0] = rows;
  return shard;
}

// Ids below, inside (at both ends) and above the shard, in any order and repeated: rows of
// the shard are the table's rows widened, every other row +0.0.
TEST_P(BackendVsReferenceTest, EmbeddingShardLooksUpItsRowsAndZeroesTheOthers) {
  const int64_t vocab = 50, e = 45;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor table = Random(dtype, {vocab, e}, rng_, -2.0f, 2.0f);
    struct Shard {
      int64_t first_id;
      int64_t rows;
    };
    for (const Shard& shard : {Shard{20, 12}, Shard{0, 25}, Shard{25, 25}, Shard{0, 50}}) {
      std::vector<int32_t> ids = {0, 19, 20, 31, 32, 49, 25, 20, 24, 26, 3, 100000};
      // Enough tokens for the CPU's threaded path too.
      std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(vocab) - 1);
      for (int i = 0; i < 800; ++i) ids.push_back(id_dist(rng_));
      for (const std::vector<int32_t>& batch : {std::vector<int32_t>(ids.begin(), ids.begin() + 12), ids}) {
        const int64_t t = static_cast<int64_t>(batch.size());
        const std::string what = std::string(DTypeName(dtype)) + " shard [" + std::to_string(shard.first_id) + ", " +
                                 std::to_string(shard.first_id + shard.rows) + ") T=" + std::to_string(t);
        std::vector<float> want(static_cast<size_t>(t * e));
        for (int64_t i = 0; i < t; ++i) {
          const int64_t id = batch[static_cast<size_t>(i)];
          const bool mine = id >= shard.first_id && id < shard.first_id + shard.rows;
          for (int64_t c = 0; c < e; ++c) want[static_cast<size_t>(i * e + c)] = mine ? table.At(id * e + c) : 0.0f;
        }
        for (Backend* backend : {backend_.get(), ref_.get()}) {
          Tensor got = Poisoned({t, e});
          backend->EmbeddingShard(batch, ShardOf(table, shard.first_id, shard.rows), shard.first_id, got.view);
          ExpectBitwise(got, want, std::string(backend->name()) + " EmbeddingShard " + what);
        }
      }
    }
  }
}

// A middle column range of src into a middle column range of dst; dst's other columns keep
// their bits. Also width 0 (nothing changes) and whole rows.
TEST_P(BackendVsReferenceTest, CopyColumnsWritesOnlyItsColumnRange) {
  struct Case {
    int64_t t, ns, nd, src_col, dst_col, width;
  };
  const std::vector<Case> cases = {{7, 40, 33, 5, 13, 11},  {1, 8, 8, 0, 0, 8},     {5, 9, 17, 9, 3, 0},
                                   {3, 12, 4, 11, 3, 1},    {2000, 30, 50, 10, 30, 20}, {0, 4, 4, 1, 1, 2}};
  for (const Case& c : cases) {
    const std::string what = "T=" + std::to_string(c.t) + " src[" + std::to_string(c.src_col) + ", +" +
                             std::to_string(c.width) + ") of " + std::to_string(c.ns) + " -> dst[" +
                             std::to_string(c.dst_col) + ") of " + std::to_string(c.nd);
    const Tensor src = Random(DType::kF32, {c.t, c.ns}, rng_);
    const Tensor dst0 = Random(DType::kF32, {c.t, c.nd}, rng_, 5.0f, 6.0f);
    std::vector<float> want(static_cast<size_t>(c.t * c.nd));
    for (int64_t r = 0; r < c.t; ++r) {
      for (int64_t j = 0; j < c.nd; ++j) {
        const bool copied = j >= c.dst_col && j < c.dst_col + c.width;
        want[static_cast<size_t>(r * c.nd + j)] =
            copied ? src.At(r * c.ns + c.src_col + (j - c.dst_col)) : dst0.At(r * c.nd + j);
      }
    }
    for (Backend* backend : {backend_.get(), ref_.get()}) {
      Tensor dst = Copy(dst0);
      backend->CopyColumns(src.view, c.src_col, dst.view, c.dst_col, c.width);
      ExpectBitwise(dst, want, std::string(backend->name()) + " CopyColumns " + what);
    }
  }
}

// Rows picked out of order and more than once (and none at all): one f32 add per element.
TEST_P(BackendVsReferenceTest, GatherAddRowsTakesRowsInAnyOrderAndRepeated) {
  struct Case {
    int64_t t, e;
    std::vector<int32_t> rows;
  };
  std::vector<Case> cases = {{9, 37, {8, 0, 3, 3, 8, 5}}, {1, 5, {0}}, {4, 16, {}}, {300, 200, {}}};
  std::uniform_int_distribution<int32_t> row_dist(0, 299);
  for (int i = 0; i < 300; ++i) cases.back().rows.push_back(row_dist(rng_));  // the threaded path
  for (const Case& c : cases) {
    const int64_t r_count = static_cast<int64_t>(c.rows.size());
    const std::string what = "T=" + std::to_string(c.t) + " E=" + std::to_string(c.e) + " R=" + std::to_string(r_count);
    const Tensor a = Random(DType::kF32, {c.t, c.e}, rng_, -4.0f, 4.0f);
    const Tensor b = Random(DType::kF32, {c.t, c.e}, rng_, -4.0f, 4.0f);
    std::vector<float> want(static_cast<size_t>(r_count * c.e));
    for (int64_t i = 0; i < r_count; ++i) {
      const int64_t row = c.rows[static_cast<size_t>(i)];
      for (int64_t j = 0; j < c.e; ++j) want[static_cast<size_t>(i * c.e + j)] = a.At(row * c.e + j) + b.At(row * c.e + j);
    }
    for (Backend* backend : {backend_.get(), ref_.get()}) {
      Tensor got = Poisoned({r_count, c.e});
      backend->GatherAddRows(a.view, b.view, c.rows, got.view);
      ExpectBitwise(got, want, std::string(backend->name()) + " GatherAddRows " + what);
    }
  }
}

// Hand-made rows with their answers: ties go to the lowest index, NaN never wins, +inf ties
// with FLT_MAX, -0 ties with +0, and a row of only NaN and -inf gives -1. V = 37 puts maxima
// in different lanes and in the tail of a vectorised scan.
TEST_P(BackendVsReferenceTest, ArgmaxRowsFollowsTheGreedyRuleOnHandMadeRows) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Row {
    std::vector<float> values;
    int32_t want;
  };
  const std::vector<Row> rows5 = {
      {{1, 3, 3, 2, 0}, 1},           {{nan, 1, nan, 1, 0}, 1},         {{-1, inf, FLT_MAX, 2, inf}, 1},
      {{FLT_MAX, inf, 0, 0, 0}, 0},   {{-inf, -inf, -inf, -inf, -inf}, -1}, {{nan, nan, nan, nan, nan}, -1},
      {{nan, -inf, nan, -inf, nan}, -1}, {{-inf, -inf, -3, -inf, nan}, 2},  {{-0.0f, 0.0f, -1, -1, -1}, 0},
      {{0.0f, -0.0f, -1, -1, -1}, 0},   {{-5, -4, -3, -2, -1}, 4},        {{nan, nan, nan, nan, 7}, 4},
  };
  const std::vector<Row> rows1 = {{{nan}, -1}, {{-inf}, -1}, {{inf}, 0}, {{-2}, 0}};
  auto row37 = [](std::initializer_list<std::pair<int, float>> set) {
    std::vector<float> v(37, -1.0f);
    for (auto [i, x] : set) v[static_cast<size_t>(i)] = x;
    return v;
  };
  const std::vector<Row> rows37 = {
      {row37({{20, 9}, {4, 9}}), 4},   {row37({{18, 9}, {33, 9}}), 18}, {row37({{34, 9}}), 34},
      {row37({{31, 9}, {17, 9}}), 17}, {row37({{36, 9}, {35, nan}}), 36}, {row37({{0, nan}, {32, 2}}), 32},
  };
  for (const std::vector<Row>* rows : {&rows5, &rows1, &rows37}) {
    const int64_t r_count = static_cast<int64_t>(rows->size());
    const int64_t v = static_cast<int64_t>(rows->front().values.size());
    std::vector<float> x;
    for (const Row& row : *rows) x.insert(x.end(), row.values.begin(), row.values.end());
    for (Backend* backend : {backend_.get(), ref_.get()}) {
      std::vector<int32_t> got(static_cast<size_t>(r_count), -7);
      backend->ArgmaxRows(TensorView::Contiguous(x.data(), DType::kF32, {r_count, v}), got);
      for (int64_t r = 0; r < r_count; ++r) {
        EXPECT_EQ(got[static_cast<size_t>(r)], (*rows)[static_cast<size_t>(r)].want)
            << backend->name() << " V=" << v << " row " << r;
      }
    }
  }
}

// The rows the CUDA argmax kernel is tested on (argmax_edge_rows.h), against the host
// sampler's greedy token itself; 4096 is large enough for the CPU's threaded path.
TEST_P(BackendVsReferenceTest, ArgmaxRowsMatchesTheHostSamplersGreedyToken) {
  for (int64_t vocab : {4096, 1001, 16}) {
    const std::vector<float> logits = kernels::test_util::ArgmaxEdgeRows(vocab, rng_);
    const int64_t rows = kernels::test_util::kArgmaxEdgeRows;
    for (Backend* backend : {backend_.get(), ref_.get()}) {
      SCOPED_TRACE(testing::Message() << backend->name() << " vocab " << vocab);
      std::vector<int32_t> got(static_cast<size_t>(rows), -7);
      backend->ArgmaxRows(TensorView::Contiguous(const_cast<float*>(logits.data()), DType::kF32, {rows, vocab}), got);
      kernels::test_util::ExpectArgmaxEdgeRows(logits, vocab, got);
    }
  }
}

// Host memory, 64-byte aligned, of the size asked (0 included), writable end to end.
TEST_P(BackendVsReferenceTest, AllocateGivesAlignedHostMemoryOfTheSizeAsked) {
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    for (int64_t bytes : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
      absl::StatusOr<std::unique_ptr<Backend::Buffer>> buffer = backend->Allocate(bytes, "activations");
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      EXPECT_EQ((*buffer)->size_bytes(), bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 64, 0u) << backend->name() << " " << bytes;
      std::memset((*buffer)->data(), 0x5a, static_cast<size_t>(bytes));
      EXPECT_EQ((*buffer)->as<uint8_t>()[bytes - 1], 0x5a);
    }
    absl::StatusOr<std::unique_ptr<Backend::Buffer>> empty = backend->Allocate(0, "nothing");
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ((*empty)->size_bytes(), 0);
    const absl::Status negative = backend->Allocate(-1, "the logits").status();
    EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(negative.message().find("the logits"), absl::string_view::npos) << negative;
  }
}

// ---- Whole KV blocks and kept block tables: both backends against expectations written here. ----

std::vector<std::byte> RandomBytes(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::byte> bytes(static_cast<size_t>(n));
  for (std::byte& b : bytes) b = static_cast<std::byte>(byte(rng));
  return bytes;
}

// A layer-major pool over `bytes`: num_layers layers of num_blocks blocks of block_bytes.
Backend::BlockPool PoolOver(std::vector<std::byte>& bytes, int64_t num_layers, int64_t num_blocks,
                            int64_t block_bytes) {
  return {.data = bytes.data(),
          .num_layers = num_layers,
          .layer_bytes = num_blocks * block_bytes,
          .block_bytes = block_bytes};
}

// What a pool of dst_blocks per layer holding `dst` should hold once block src of every
// layer of `src` (src_blocks per layer) is copied onto its block dst, for each pair.
std::vector<std::byte> AfterCopies(const std::vector<std::byte>& src, int64_t src_blocks, std::vector<std::byte> dst,
                                   int64_t dst_blocks, int64_t num_layers, int64_t block_bytes,
                                   const std::vector<int32_t>& pairs) {
  for (size_t i = 0; i < pairs.size(); i += 2) {
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      const int64_t from = (layer * src_blocks + pairs[i]) * block_bytes;
      const int64_t to = (layer * dst_blocks + pairs[i + 1]) * block_bytes;
      std::copy_n(src.begin() + from, block_bytes, dst.begin() + to);
    }
  }
  return dst;
}

// Every layer of each dst block gets its src block; every other block (and every layer of
// it) keeps its bytes. Large cases take the CPU's threaded path: many blocks, and one
// block of many layers.
TEST_P(BackendVsReferenceTest, CopyBlocksCopiesEveryLayerOfEachPairAndNothingElse) {
  struct Case {
    int64_t num_layers, num_blocks, block_bytes;
    std::vector<int32_t> pairs;
  };
  std::vector<Case> cases = {{3, 7, 48, {0, 5, 3, 1, 2, 6}}, {1, 2, 16, {1, 0}}, {2, 4, 32, {}},
                             {32, 3, 8192, {2, 0}},          {4, 40, 4096, {}}};
  for (int32_t i = 0; i < 15; ++i) cases.back().pairs.insert(cases.back().pairs.end(), {i, 39 - i});
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.num_layers) + " layers x " + std::to_string(c.num_blocks) +
                             " blocks of " + std::to_string(c.block_bytes) + " B, " +
                             std::to_string(c.pairs.size() / 2) + " pairs";
    const std::vector<std::byte> before = RandomBytes(c.num_layers * c.num_blocks * c.block_bytes, rng_);
    const std::vector<std::byte> want =
        AfterCopies(before, c.num_blocks, before, c.num_blocks, c.num_layers, c.block_bytes, c.pairs);
    for (Backend* backend : {backend_.get(), ref_.get()}) {
      std::vector<std::byte> pool = before;
      backend->CopyBlocks(PoolOver(pool, c.num_layers, c.num_blocks, c.block_bytes), c.pairs);
      EXPECT_TRUE(pool == want) << backend->name() << " CopyBlocks " << what;
    }
  }
}

// A pool of 9 blocks offloads to a host pool of 4 and onboards from it into another pool of
// 9; a block goes to a one-block slot (layer_bytes == block_bytes) and back. The source
// pool never changes; only the named blocks of the destination do, every layer of them.
TEST_P(BackendVsReferenceTest, SwapBlocksMovesBlocksBetweenPoolsOfDifferentSizes) {
  for (auto [num_layers, block_bytes] : std::vector<std::pair<int64_t, int64_t>>{{3, 64}, {8, 16384}}) {
    const std::string what = std::to_string(num_layers) + " layers, blocks of " + std::to_string(block_bytes) + " B";
    struct Swap {
      int64_t src_blocks, dst_blocks;
      std::vector<int32_t> pairs;
    };
    const std::vector<Swap> swaps = {
        {9, 4, {7, 0, 2, 3, 4, 1}},  // offload
        {4, 9, {0, 8, 3, 5, 1, 0}},  // onboard
        {9, 1, {5, 0}},              // to a slot
        {1, 9, {0, 2}},              // from a slot
        {9, 4, {}},
    };
    for (const Swap& swap : swaps) {
      const std::vector<std::byte> src0 = RandomBytes(num_layers * swap.src_blocks * block_bytes, rng_);
      const std::vector<std::byte> dst0 = RandomBytes(num_layers * swap.dst_blocks * block_bytes, rng_);
      const std::vector<std::byte> want =
          AfterCopies(src0, swap.src_blocks, dst0, swap.dst_blocks, num_layers, block_bytes, swap.pairs);
      for (Backend* backend : {backend_.get(), ref_.get()}) {
        std::vector<std::byte> src = src0;
        std::vector<std::byte> dst = dst0;
        backend->SwapBlocks(PoolOver(src, num_layers, swap.src_blocks, block_bytes),
                            PoolOver(dst, num_layers, swap.dst_blocks, block_bytes), swap.pairs);
        EXPECT_TRUE(dst == want) << backend->name() << " SwapBlocks " << swap.src_blocks << " -> " << swap.dst_blocks
                                 << " blocks, " << what;
        EXPECT_TRUE(src == src0) << backend->name() << " SwapBlocks changed its source, " << what;
      }
    }
  }
}

TEST_P(BackendVsReferenceTest, ScatterPairsSetsEachIndexAndNothingElse) {
  std::vector<int32_t> before(50);
  std::uniform_int_distribution<int32_t> value(-1000, 1000);
  for (int32_t& v : before) v = value(rng_);
  const std::vector<int32_t> updates = {3, 100, 49, -1, 0, 7, 20, 20};
  std::vector<int32_t> want = before;
  want[3] = 100;
  want[49] = -1;
  want[0] = 7;
  want[20] = 20;
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    std::vector<int32_t> array = before;
    backend->ScatterPairs(updates, array);
    EXPECT_EQ(array, want) << backend->name();
    backend->ScatterPairs({}, array);
    EXPECT_EQ(array, want) << backend->name() << " no updates";
  }
}

// Kept rows of stride 5 (row r holds 100 r + 1 .. 100 r + 5), blocks of 16 tokens. Row i of
// out takes ceil(context / 16) entries of its kept row, at most the stride and out_cols,
// and zeros after; a sequence with no kept row (-1), or an empty context, is all zeros.
TEST_P(BackendVsReferenceTest, GatherTableRowsTakesEachContextsBlocksAndZeroesTheRest) {
  const int64_t row_stride = 5;
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < 4; ++r) {
    for (int32_t j = 1; j <= row_stride; ++j) rows.push_back(100 * r + j);
  }
  const std::vector<int32_t> rows_of = {2, -1, 0, 3, 1, 0};
  const std::vector<int32_t> context_lens = {17, 100, 0, 33, 80, 200};
  // out_cols 7 > row_stride: at most 5 entries a row, then zeros.
  const std::vector<int32_t> want7 = {
      201, 202, 0,   0,   0,   0, 0,  // 2 blocks
      0,   0,   0,   0,   0,   0, 0,  // no kept row
      0,   0,   0,   0,   0,   0, 0,  // empty context
      301, 302, 303, 0,   0,   0, 0,  // 3 blocks
      101, 102, 103, 104, 105, 0, 0,  // 5 blocks: the whole row
      1,   2,   3,   4,   5,   0, 0,  // 13 blocks: the whole row, no more
  };
  // out_cols 3 < row_stride: the first 3 entries at most.
  const std::vector<int32_t> want3 = {201, 202, 0, 0, 0, 0, 0, 0, 0, 301, 302, 303, 101, 102, 103, 1, 2, 3};
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    for (const std::vector<int32_t>* want : {&want7, &want3}) {
      std::vector<int32_t> out(want->size(), -7);
      backend->GatherTableRows(rows, row_stride, rows_of, context_lens, 16, out);
      EXPECT_EQ(out, *want) << backend->name() << " out_cols " << want->size() / rows_of.size();
    }
  }
}

// Host backends' ops never fail, but a runner's own work may: the first status recorded is
// what TakeError returns, once.
TEST_P(BackendVsReferenceTest, TakeErrorReturnsTheFirstRecordedErrorOnce) {
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    EXPECT_TRUE(backend->TakeError().ok()) << backend->name();
    backend->RecordError(absl::InternalError("the first"));
    backend->RecordError(absl::UnavailableError("the second"));
    const absl::Status taken = backend->TakeError();
    EXPECT_EQ(taken.code(), absl::StatusCode::kInternal) << backend->name() << ": " << taken;
    EXPECT_EQ(taken.message(), "the first") << backend->name();
    EXPECT_TRUE(backend->TakeError().ok()) << backend->name();
    backend->RecordError(absl::DataLossError("a later one"));
    EXPECT_EQ(backend->TakeError().code(), absl::StatusCode::kDataLoss) << backend->name();
    EXPECT_TRUE(backend->TakeError().ok()) << backend->name();
  }
}

TEST_P(BackendVsReferenceTest, HostBackendsHaveNoQueueAndReserveNoWorkspace) {
  for (Backend* backend : {backend_.get(), ref_.get()}) {
    EXPECT_EQ(backend->queue(), nullptr) << backend->name();
    const absl::Status reserved = backend->ReserveWorkspace({.max_tokens = 512,
                                                             .max_width = 4096,
                                                             .max_seqs = 64,
                                                             .num_heads = 32,
                                                             .num_kv_heads = 8,
                                                             .head_dim = 128,
                                                             .max_context_len = 8192});
    EXPECT_TRUE(reserved.ok()) << backend->name() << ": " << reserved;
    EXPECT_TRUE(backend->TakeError().ok()) << backend->name();
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, BackendVsReferenceTest,
                         ::testing::Values(BackendCase{"avx512", 0}, BackendCase{"avx2", 0}, BackendCase{"avx512", 1},
                                           BackendCase{"avx2", 3}, BackendCase{"amx", 0}, BackendCase{"amx", 1},
                                           BackendCase{"avx512bf16", 0}, BackendCase{"avx512bf16", 1}),
                         [](const ::testing::TestParamInfo<BackendCase>& info) {
                           return info.param.isa + "_threads" + std::to_string(info.param.num_threads);
                         });

// The CPU backend stops, naming the op and what is wrong, on arguments outside the
// contracts of the block ops (ops.h, clause 1), rather than copying out of bounds.
TEST(CpuBackendDeathTest, BlockOpsStopOnArgumentsOutsideTheirContract) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto cpu = CreateCpuBackend({.num_threads = 1});
  if (!cpu.ok()) GTEST_SKIP() << cpu.status();
  Backend& backend = **cpu;
  std::vector<std::byte> device(2 * 4 * 16), host(2 * 2 * 16);
  const Backend::BlockPool pool{.data = device.data(), .num_layers = 2, .layer_bytes = 64, .block_bytes = 16};
  const Backend::BlockPool two{.data = host.data(), .num_layers = 2, .layer_bytes = 32, .block_bytes = 16};
  const Backend::BlockPool one_layer{.data = host.data(), .num_layers = 1, .layer_bytes = 64, .block_bytes = 16};
  using Ids = std::vector<int32_t>;
  EXPECT_DEATH(backend.CopyBlocks(pool, Ids{0, 4}), "CopyBlocks: block pair 0 \\(0, 4\\) is outside");
  EXPECT_DEATH(backend.CopyBlocks(pool, Ids{0, 1, 2}), "pairs.size\\(\\) % 2 == 0");
  EXPECT_DEATH(backend.CopyBlocks(pool, Ids{0, 1, 2, 1}), "block 1 is the destination of two pairs");
  EXPECT_DEATH(backend.CopyBlocks(pool, Ids{0, 1, 1, 2}), "block 1 is both copied onto and copied from");
  EXPECT_DEATH(backend.SwapBlocks(pool, two, Ids{3, 2}), "SwapBlocks: block pair 0 \\(3, 2\\) is outside");
  EXPECT_DEATH(backend.SwapBlocks(pool, one_layer, Ids{0, 0}), "SwapBlocks: pools of 2 layers");
  std::vector<int32_t> array(4);
  EXPECT_DEATH(backend.ScatterPairs(Ids{4, 1}, array), "backend check failed");
  const Ids rows = {1, 2, 3, 4}, rows_of = {2}, context_lens = {16};
  EXPECT_DEATH(backend.GatherTableRows(rows, 2, rows_of, context_lens, 16, array), "backend check failed");
  EXPECT_DEATH(backend.GatherTableRows(rows, 2, rows_of, Ids{16, 16}, 16, array), "backend check failed");
}

TEST(CpuBackendTest, UnknownIsaIsInvalidArgument) {
  EXPECT_EQ(CreateCpuBackend({.isa = "sse2"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, AComputeDtypeOtherThanF32OrBf16IsInvalidArgument) {
  EXPECT_EQ(CreateCpuBackend({.compute_dtype = DType::kF16}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmesh::backend
