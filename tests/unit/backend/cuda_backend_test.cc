// The CUDA backend's ops against the CPU backend (libs/backend/cuda/cuda_backend.cc), on
// seeded random inputs of awkward sizes, each with its stated tolerance:
//   Linear: f32 weights (f32 GEMM, TF32 off) max |d| <= 1e-4 * (1 + |ref|) at K <= 1000;
//     bf16/f16 weights: the GPU rounds the activation to the weight type, so compare
//     with the CPU on the same rounded activation: <= 1e-3 * (1 + |ref|) (f32
//     accumulation in another order), with and without bias, M 1, 7, 257.
//   Embedding, EmbeddingShard (ids below, in and above the shard), CopyColumns,
//     GatherAddRows: bitwise. ArgmaxRows: the same index as the CPU backend on the argmax
//     kernel test's edge rows (and the host sampler's greedy token), also from a view whose
//     base is not 16-byte aligned. Allocate: device memory; out of memory is
//     ResourceExhausted and leaves no error behind for the next op. RmsNorm / AddRmsNorm / SiluAndMul / RoPE: <= 2e-5 * (1 + |ref|).
//   DenseAttention: <= 2e-5 * (1 + |ref|) (f32, another summation order).
//   WriteKvCache + PagedAttention through the backend: a decode batch (split-K kernel)
//     <= 2e-5 * (1 + |ref|); a prefill batch (bf16 tensor cores) relative L2 <= 1e-2.
//   CopyBlocks, SwapBlocks (a pinned host pool: the kernel; a pageable one or pageable
//     pairs: the cudaMemcpyAsync fallback; slots of one block), ScatterPairs and
//     GatherTableRows: bitwise. A swap pair outside its pool is recorded as InvalidArgument
//     and copies nothing. RecordError keeps the first error, queue() is the stream,
//     ReserveWorkspace sizes the scratch.
// Skips where no GPU can be used (CI), saying why.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"

#include "argmax_edge_rows.h"
#include "core/dtype.h"
#include "kv/kv_layout.h"

namespace kvmesh::backend::cuda {
namespace {

// Host data and its device copy, as one tensor.
class HostDevice {
 public:
  HostDevice(DType dtype, std::initializer_list<int64_t> shape) : shape_(shape) {
    const TensorView v = TensorView::Contiguous(nullptr, dtype, shape);
    host_.resize(static_cast<size_t>(v.num_bytes()));
    auto d = AllocateDevice(host_.size(), "a test tensor");
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) device_ = std::move(d).value();
    dtype_ = dtype;
  }
  TensorView host() { return View(host_.data()); }
  TensorView device() { return View(device_.get()); }
  float* f32() { return reinterpret_cast<float*>(host_.data()); }
  uint16_t* u16() { return reinterpret_cast<uint16_t*>(host_.data()); }
  int64_t size() const { return static_cast<int64_t>(host_.size() / DTypeSize(dtype_)); }
  void Upload() {
    ASSERT_EQ(cudaMemcpy(device_.get(), host_.data(), host_.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> DownloadF32() {
    std::vector<float> out(host_.size() / sizeof(float));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), device_.get(), host_.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // Fills with uniform values in [-1, 1] (stored in the tensor's dtype).
  void Randomize(std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (int64_t i = 0; i < size(); ++i) {
      const float x = dist(rng);
      if (dtype_ == DType::kF32) f32()[i] = x;
      if (dtype_ == DType::kBF16) u16()[i] = F32ToBf16(x);
      if (dtype_ == DType::kF16) u16()[i] = F32ToF16(x);
    }
    Upload();
  }
  // Poisons the device copy (NaN bytes) so that unwritten outputs fail.
  void Poison() { ASSERT_EQ(cudaMemset(device_.get(), 0xff, host_.size()), cudaSuccess); }

 private:
  TensorView View(void* data) {
    TensorView v;
    v.data = data;
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    int64_t stride = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.shape[d] = shape_[d];
      v.strides[d] = stride;
      stride *= shape_[d];
    }
    return v;
  }

  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  std::vector<uint8_t> host_;
  DeviceMemory device_;
};

template <typename T>
DeviceMemory UploadVector(const std::vector<T>& v) {
  auto d = AllocateDevice(sizeof(T) * v.size(), "test metadata");
  EXPECT_TRUE(d.ok());
  EXPECT_EQ(cudaMemcpy(d->get(), v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return std::move(d).value();
}

template <typename T>
std::vector<T> DownloadVector(const DeviceMemory& d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), d.get(), sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Rows first_id .. first_id + rows - 1 of a [V, E] view: one rank's shard of the table.
TensorView ShardOf(TensorView table, int64_t first_id, int64_t rows) {
  table.data = static_cast<uint8_t*>(table.data) + first_id * table.strides[0] * DTypeSize(table.dtype);
  table.shape[0] = rows;
  return table;
}

void ExpectClose(const std::vector<float>& got, const float* want, int64_t n, float tol, const char* what) {
  float worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " [" << i << "] = " << got[i];
    const float err = std::fabs(got[i] - want[i]) / (1.f + std::fabs(want[i]));
    worst = std::max(worst, err);
    ASSERT_LE(err, tol) << what << " [" << i << "]: " << got[i] << " vs " << want[i];
  }
  std::printf("%s: worst scaled |d| %.3g\n", what, worst);
}

class CudaBackendKernelTest : public testing::Test {
 protected:
  void SetUp() override {
    auto gpu = CudaBackend::Create({});
    if (!gpu.ok()) GTEST_SKIP() << "no GPU here (" << gpu.status().message() << "); this test runs where one is";
    gpu_ = std::move(gpu).value();
    auto cpu = CreateCpuBackend({});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(cpu).value();
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
      EXPECT_TRUE(gpu_->TakeError().ok());
    }
  }

  std::mt19937 rng_{1234};
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaBackendKernelTest, LinearMatchesCpuForEveryWeightType) {
  for (DType wtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool with_bias : {false, true}) {
      for (int64_t m : {1, 7, 257}) {
        SCOPED_TRACE(testing::Message() << DTypeName(wtype) << " bias " << with_bias << " M " << m);
        const int64_t k = 1000, n1 = 96, n2 = 33;
        HostDevice w1(wtype, {n1, k}), w2(wtype, {n2, k}), b1(DType::kF32, {n1}), b2(DType::kF32, {n2});
        w1.Randomize(rng_);
        w2.Randomize(rng_);
        b1.Randomize(rng_);
        b2.Randomize(rng_);
        std::vector<TensorView> parts = {w1.host(), w2.host()};
        std::vector<TensorView> biases;
        if (with_bias) biases = {b1.host(), b2.host()};
        auto gpu_w = gpu_->PackLinear(parts, biases);
        auto cpu_w = cpu_->PackLinear(parts, biases);
        ASSERT_TRUE(gpu_w.ok()) << gpu_w.status();
        ASSERT_TRUE(cpu_w.ok()) << cpu_w.status();
        HostDevice x(DType::kF32, {m, k}), out(DType::kF32, {m, n1 + n2});
        x.Randomize(rng_);
        // The GPU's operand is x rounded to the weight's 16-bit type: give the CPU the same.
        if (wtype != DType::kF32) {
          for (int64_t i = 0; i < x.size(); ++i) {
            x.f32()[i] = wtype == DType::kBF16 ? RoundToBf16(x.f32()[i]) : F16ToF32(F32ToF16(x.f32()[i]));
          }
          x.Upload();
        }
        out.Poison();
        gpu_->Linear(x.device(), **gpu_w, out.device());
        cpu_->Linear(x.host(), **cpu_w, out.host());
        ExpectClose(out.DownloadF32(), out.f32(), m * (n1 + n2), wtype == DType::kF32 ? 1e-4f : 1e-3f, "Linear");
      }
    }
  }
}

TEST_F(CudaBackendKernelTest, EmbeddingIsExactForEveryTableType) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    HostDevice table(dtype, {1000, 72}), out(DType::kF32, {5, 72});
    table.Randomize(rng_);
    const std::vector<int32_t> ids = {0, 999, 17, 17, 500};
    DeviceMemory d_ids = UploadVector(ids);
    out.Poison();
    gpu_->Embedding({d_ids.as<int32_t>(), ids.size()}, table.device(), out.device());
    cpu_->Embedding(ids, table.host(), out.host());
    const std::vector<float> got = out.DownloadF32();
    ASSERT_EQ(std::memcmp(got.data(), out.f32(), sizeof(float) * got.size()), 0) << DTypeName(dtype);
  }
}

TEST_F(CudaBackendKernelTest, EmbeddingShardIsExactAndZeroesOtherRanksRows) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    HostDevice table(dtype, {1000, 72}), out(DType::kF32, {9, 72});
    table.Randomize(rng_);
    const std::vector<int32_t> ids = {0, 299, 300, 699, 700, 999, 450, 300, 100000};
    DeviceMemory d_ids = UploadVector(ids);
    out.Poison();
    gpu_->EmbeddingShard({d_ids.as<int32_t>(), ids.size()}, ShardOf(table.device(), 300, 400), 300, out.device());
    cpu_->EmbeddingShard(ids, ShardOf(table.host(), 300, 400), 300, out.host());
    const std::vector<float> got = out.DownloadF32();
    ASSERT_EQ(std::memcmp(got.data(), out.f32(), sizeof(float) * got.size()), 0) << DTypeName(dtype);
    EXPECT_EQ(got[0], 0.f);
    EXPECT_EQ(got[2 * 72], LoadAsF32(table.host().data, dtype, 300 * 72));
  }
}

TEST_F(CudaBackendKernelTest, CopyColumnsAndGatherAddRowsAreExact) {
  HostDevice src(DType::kF32, {37, 130}), dst(DType::kF32, {37, 70});
  src.Randomize(rng_);
  dst.Randomize(rng_);  // the columns outside the copied range must keep these
  gpu_->CopyColumns(src.device(), 17, dst.device(), 20, 40);
  cpu_->CopyColumns(src.host(), 17, dst.host(), 20, 40);
  std::vector<float> got = dst.DownloadF32();
  ASSERT_EQ(std::memcmp(got.data(), dst.f32(), sizeof(float) * got.size()), 0) << "CopyColumns";

  HostDevice a(DType::kF32, {50, 300}), b(DType::kF32, {50, 300}), out(DType::kF32, {6, 300});
  a.Randomize(rng_);
  b.Randomize(rng_);
  out.Poison();
  const std::vector<int32_t> rows = {49, 0, 7, 7, 20, 3};
  DeviceMemory d_rows = UploadVector(rows);
  gpu_->GatherAddRows(a.device(), b.device(), {d_rows.as<int32_t>(), rows.size()}, out.device());
  cpu_->GatherAddRows(a.host(), b.host(), rows, out.host());
  got = out.DownloadF32();
  ASSERT_EQ(std::memcmp(got.data(), out.f32(), sizeof(float) * got.size()), 0) << "GatherAddRows";
}

TEST_F(CudaBackendKernelTest, ArgmaxRowsMatchesCpuOnEdgeRows) {
  const int64_t rows = kernels::test_util::kArgmaxEdgeRows;
  for (int64_t vocab : {32000, 1001, 4096}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const std::vector<float> logits = kernels::test_util::ArgmaxEdgeRows(vocab, rng_);
    std::vector<int32_t> want(static_cast<size_t>(rows), -7);
    cpu_->ArgmaxRows(TensorView::Contiguous(const_cast<float*>(logits.data()), DType::kF32, {rows, vocab}), want);
    // Also from one float into the buffer: a base the kernel's 16-byte loads cannot take.
    for (int64_t offset : {0, 1}) {
      std::vector<float> padded(static_cast<size_t>(offset), 0.f);
      padded.insert(padded.end(), logits.begin(), logits.end());
      DeviceMemory d_logits = UploadVector(padded);
      DeviceMemory d_out = UploadVector(std::vector<int32_t>(static_cast<size_t>(rows), -7));
      gpu_->ArgmaxRows(TensorView::Contiguous(d_logits.as<float>() + offset, DType::kF32, {rows, vocab}),
                       {d_out.as<int32_t>(), static_cast<size_t>(rows)});
      const std::vector<int32_t> got = DownloadVector<int32_t>(d_out, static_cast<size_t>(rows));
      EXPECT_EQ(got, want) << "offset " << offset;
      kernels::test_util::ExpectArgmaxEdgeRows(logits, vocab, got);
    }
  }
}

TEST_F(CudaBackendKernelTest, AllocateGivesDeviceMemoryAndOutOfMemoryLeavesNoError) {
  absl::StatusOr<std::unique_ptr<Backend::Buffer>> buffer = gpu_->Allocate(1 << 20, "activations");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->size_bytes(), 1 << 20);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, (*buffer)->data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaMemset((*buffer)->data(), 0, 1 << 20), cudaSuccess);
  absl::StatusOr<std::unique_ptr<Backend::Buffer>> empty = gpu_->Allocate(0, "nothing");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->size_bytes(), 0);
  EXPECT_EQ(gpu_->Allocate(-1, "a negative size").status().code(), absl::StatusCode::kInvalidArgument);

  const absl::Status huge = gpu_->Allocate(int64_t{1} << 52, "a 4 PiB KV pool").status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  EXPECT_NE(huge.message().find("a 4 PiB KV pool"), absl::string_view::npos) << huge;
  EXPECT_TRUE(gpu_->TakeError().ok());
  // The next launch does not inherit the failed cudaMalloc as its own error.
  HostDevice a(DType::kF32, {4, 64}), out(DType::kF32, {1, 64});
  a.Randomize(rng_);
  const std::vector<int32_t> rows = {2};
  DeviceMemory d_rows = UploadVector(rows);
  gpu_->GatherAddRows(a.device(), a.device(), {d_rows.as<int32_t>(), 1}, out.device());
  ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
  EXPECT_TRUE(gpu_->TakeError().ok());
}

TEST_F(CudaBackendKernelTest, NormsRopeAndSiluMatchCpu) {
  const int64_t t = 37, e = 520, h = 8, hkv = 2, d = 64, inter = 300;
  HostDevice x(DType::kF32, {t, e}), residual(DType::kF32, {t, e}), weight(DType::kF32, {e}), out(DType::kF32, {t, e});
  x.Randomize(rng_);
  residual.Randomize(rng_);
  weight.Randomize(rng_);
  out.Poison();
  gpu_->RmsNorm(x.device(), weight.device(), 1e-5f, out.device());
  cpu_->RmsNorm(x.host(), weight.host(), 1e-5f, out.host());
  ExpectClose(out.DownloadF32(), out.f32(), t * e, 2e-5f, "RmsNorm");
  gpu_->AddRmsNorm(residual.device(), x.device(), weight.device(), 1e-5f, out.device());
  cpu_->AddRmsNorm(residual.host(), x.host(), weight.host(), 1e-5f, out.host());
  ExpectClose(out.DownloadF32(), out.f32(), t * e, 2e-5f, "AddRmsNorm");
  ExpectClose(residual.DownloadF32(), residual.f32(), t * e, 0.f, "AddRmsNorm's residual");

  HostDevice q(DType::kF32, {t, h, d}), k(DType::kF32, {t, hkv, d});
  q.Randomize(rng_);
  k.Randomize(rng_);
  std::vector<int32_t> positions(t);
  for (int64_t i = 0; i < t; ++i) positions[i] = static_cast<int32_t>(i * 97 % 4000);
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / d);
  DeviceMemory d_pos = UploadVector(positions), d_freq = UploadVector(inv_freq);
  gpu_->ApplyRope(q.device(), k.device(), {d_pos.as<int32_t>(), positions.size()},
                  {d_freq.as<float>(), inv_freq.size()});
  cpu_->ApplyRope(q.host(), k.host(), positions, inv_freq);
  ExpectClose(q.DownloadF32(), q.f32(), t * h * d, 2e-5f, "RoPE q");
  ExpectClose(k.DownloadF32(), k.f32(), t * hkv * d, 2e-5f, "RoPE k");

  HostDevice gate_up(DType::kF32, {t, 2 * inter}), act(DType::kF32, {t, inter});
  gate_up.Randomize(rng_);
  act.Poison();
  gpu_->SiluAndMul(gate_up.device(), act.device());
  cpu_->SiluAndMul(gate_up.host(), act.host());
  ExpectClose(act.DownloadF32(), act.f32(), t * inter, 2e-5f, "SiluAndMul");
}

TEST_F(CudaBackendKernelTest, DenseAttentionMatchesCpu) {
  for (int64_t d : {64, 128}) {
    const int64_t s = 300, t = 257, h = 8, hkv = 2;
    HostDevice q(DType::kF32, {t, h, d}), kc(DType::kF32, {s, hkv, d}), vc(DType::kF32, {s, hkv, d}),
        out(DType::kF32, {t, h, d});
    q.Randomize(rng_);
    kc.Randomize(rng_);
    vc.Randomize(rng_);
    out.Poison();
    std::vector<int32_t> positions(t);
    for (int64_t i = 0; i < t; ++i) positions[i] = static_cast<int32_t>(s - t + i);
    DeviceMemory d_pos = UploadVector(positions);
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    gpu_->DenseAttention(q.device(), kc.device(), vc.device(), {d_pos.as<int32_t>(), positions.size()}, scale,
                         out.device());
    cpu_->DenseAttention(q.host(), kc.host(), vc.host(), positions, scale, out.host());
    ExpectClose(out.DownloadF32(), out.f32(), t * h * d, 2e-5f, "DenseAttention");
  }
}

// WriteKvCache then PagedAttention through the backend, on a bf16 pool: a decode batch
// (the split-K kernel) and a prefill batch with a cached prefix (the tensor-core kernel).
TEST_F(CudaBackendKernelTest, PagedAttentionDispatchesDecodeAndPrefill) {
  const int32_t h = 8, hkv = 2, d = 128, block = 16, num_blocks = 64;
  auto storage = kv::KvStorage::Create({.num_layers = 1,
                                        .num_kv_heads = hkv,
                                        .head_dim = d,
                                        .block_size_tokens = block,
                                        .dtype = DType::kBF16,
                                        .num_blocks = num_blocks})
                     .value();
  HostDevice pool(DType::kBF16, {num_blocks, 2, hkv, block, d});
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng_);
  // Two sequences of 200 and 70 tokens; all their K/V written through WriteKvCache.
  const std::vector<int32_t> lens = {200, 70};
  const int32_t max_blocks = 13;
  std::vector<int32_t> tables(2 * max_blocks, 0);
  std::vector<int64_t> slots;
  int next = 0;
  for (int s = 0; s < 2; ++s) {
    for (int b = 0; b < (lens[s] + block - 1) / block; ++b) tables[s * max_blocks + b] = blocks[next++];
    for (int p = 0; p < lens[s]; ++p) slots.push_back(int64_t{tables[s * max_blocks + p / block]} * block + p % block);
  }
  const int64_t total = static_cast<int64_t>(slots.size());
  HostDevice k(DType::kF32, {total, hkv, d}), v(DType::kF32, {total, hkv, d});
  k.Randomize(rng_);
  v.Randomize(rng_);
  DeviceMemory d_slots = UploadVector(slots), d_tables = UploadVector(tables);
  ASSERT_EQ(cudaMemset(pool.device().data, 0, static_cast<size_t>(pool.device().num_bytes())), cudaSuccess);
  gpu_->WriteKvCache(k.device(), v.device(), {d_slots.as<int64_t>(), slots.size()}, pool.device());
  cpu_->WriteKvCache(k.host(), v.host(), slots, storage->LayerView(0));
  ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
  std::vector<uint8_t> gpu_pool(static_cast<size_t>(storage->size_bytes()));
  ASSERT_EQ(cudaMemcpy(gpu_pool.data(), pool.device().data, gpu_pool.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(std::memcmp(gpu_pool.data(), storage->data(), gpu_pool.size()), 0) << "pools differ after WriteKvCache";

  for (const std::vector<int32_t>& query_lens : {std::vector<int32_t>{1, 1}, std::vector<int32_t>{57, 1}}) {
    const bool decode = query_lens[0] == 1;
    std::vector<int32_t> query_start = {0, query_lens[0], query_lens[0] + query_lens[1]};
    const int64_t t = query_start[2];
    HostDevice q(DType::kF32, {t, h, d}), out(DType::kF32, {t, h, d});
    q.Randomize(rng_);
    out.Poison();
    DeviceMemory d_qs = UploadVector(query_start), d_lens = UploadVector(lens);
    const PagedAttentionBatch gpu_batch{.query_start = {d_qs.as<int32_t>(), 3},
                                        .context_lens = {d_lens.as<int32_t>(), 2},
                                        .block_tables = {d_tables.as<int32_t>(), tables.size()},
                                        .max_blocks_per_seq = max_blocks,
                                        .max_query_len = std::max(query_lens[0], query_lens[1]),
                                        .max_context_len = 200};
    const PagedAttentionBatch cpu_batch{
        .query_start = query_start, .context_lens = lens, .block_tables = tables, .max_blocks_per_seq = max_blocks};
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    gpu_->PagedAttention(q.device(), pool.device(), gpu_batch, scale, out.device());
    cpu_->PagedAttention(q.host(), storage->LayerView(0), cpu_batch, scale, out.host());
    const std::vector<float> got = out.DownloadF32();
    if (decode) {
      ExpectClose(got, out.f32(), t * h * d, 2e-5f, "PagedAttention (decode)");
    } else {
      double err = 0, norm = 0;
      for (int64_t i = 0; i < t * h * d; ++i) {
        ASSERT_TRUE(std::isfinite(got[i]));
        err += (got[i] - out.f32()[i]) * double{got[i] - out.f32()[i]};
        norm += double{out.f32()[i]} * out.f32()[i];
      }
      EXPECT_LE(std::sqrt(err / norm), 1e-2) << "PagedAttention (prefill)";
    }
  }
}

// ---- Whole KV blocks and kept block tables, against the CPU backend. ----

std::vector<std::byte> RandomBytes(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::byte> bytes(static_cast<size_t>(n));
  for (std::byte& b : bytes) b = static_cast<std::byte>(byte(rng));
  return bytes;
}

Backend::BlockPool PoolAt(void* data, int64_t num_layers, int64_t num_blocks, int64_t block_bytes) {
  return {.data = static_cast<std::byte*>(data),
          .num_layers = num_layers,
          .layer_bytes = num_blocks * block_bytes,
          .block_bytes = block_bytes};
}

std::vector<std::byte> Download(const DeviceMemory& d) {
  std::vector<std::byte> bytes(d.bytes());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(bytes.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return bytes;
}

// Host memory for a test: pinned (cudaHostAlloc, which the GPU addresses in place) or
// pageable (a vector, which it cannot).
class HostBytes {
 public:
  HostBytes(const void* from, size_t bytes, bool pinned) : bytes_(bytes) {
    if (pinned) {
      auto memory = AllocatePinnedHost(bytes, "a test's host pool");
      EXPECT_TRUE(memory.ok()) << memory.status();
      if (memory.ok()) pinned_ = std::move(memory).value();
    } else {
      pageable_.resize(bytes);
    }
    std::memcpy(data(), from, bytes);
  }
  std::byte* data() { return pinned_.get() != nullptr ? pinned_.as<std::byte>() : pageable_.data(); }
  std::vector<std::byte> Bytes() { return std::vector<std::byte>(data(), data() + bytes_); }

 private:
  const size_t bytes_;
  PinnedHostMemory pinned_;
  std::vector<std::byte> pageable_;
};

TEST_F(CudaBackendKernelTest, CopyBlocksMatchesCpu) {
  for (int64_t block_bytes : {2048, 1000}) {  // 16-byte copies, and the byte-wise fallback
    SCOPED_TRACE(testing::Message() << "blocks of " << block_bytes << " B");
    const int64_t layers = 4, blocks = 20;
    std::vector<std::byte> want = RandomBytes(layers * blocks * block_bytes, rng_);
    DeviceMemory pool = UploadVector(want);
    const std::vector<int32_t> pairs = {3, 10, 0, 19, 7, 2, 4, 5};
    DeviceMemory d_pairs = UploadVector(pairs);
    gpu_->CopyBlocks(PoolAt(pool.get(), layers, blocks, block_bytes), {d_pairs.as<int32_t>(), pairs.size()});
    cpu_->CopyBlocks(PoolAt(want.data(), layers, blocks, block_bytes), pairs);
    EXPECT_TRUE(Download(pool) == want);
  }
}

// A device pool of 9 blocks offloads to a host pool of 4 and onboards from it, then to a
// one-block slot and back, on the GPU and on the CPU over copies of the same bytes.
// `pinned`: where the host pool and the pairs live (false: the cudaMemcpyAsync path).
void ExpectSwapsMatchCpu(CudaBackend& gpu, Backend& cpu, bool pinned_pool, bool pinned_pairs, std::mt19937& rng) {
  const int64_t layers = 3, device_blocks = 9;
  for (int64_t block_bytes : {1024, 1000}) {
    for (int64_t host_blocks : {4, 1}) {
      SCOPED_TRACE(testing::Message() << "pinned pool " << pinned_pool << ", pinned pairs " << pinned_pairs
                                      << ", blocks of " << block_bytes << " B, " << host_blocks << " host blocks");
      std::vector<std::byte> cpu_device = RandomBytes(layers * device_blocks * block_bytes, rng);
      std::vector<std::byte> cpu_host = RandomBytes(layers * host_blocks * block_bytes, rng);
      DeviceMemory device = UploadVector(cpu_device);
      HostBytes host(cpu_host.data(), cpu_host.size(), pinned_pool);
      const Backend::BlockPool gpu_device = PoolAt(device.get(), layers, device_blocks, block_bytes);
      const Backend::BlockPool gpu_host = PoolAt(host.data(), layers, host_blocks, block_bytes);
      const Backend::BlockPool cpu_device_pool = PoolAt(cpu_device.data(), layers, device_blocks, block_bytes);
      const Backend::BlockPool cpu_host_pool = PoolAt(cpu_host.data(), layers, host_blocks, block_bytes);
      using Ids = std::vector<int32_t>;
      const Ids offload = host_blocks == 4 ? Ids{7, 0, 2, 3} : Ids{5, 0};
      const Ids onboard = host_blocks == 4 ? Ids{0, 8, 3, 5, 1, 0} : Ids{0, 2};
      for (bool to_host : {true, false}) {
        const std::vector<int32_t>& pairs = to_host ? offload : onboard;
        HostBytes pair_bytes(pairs.data(), sizeof(int32_t) * pairs.size(), pinned_pairs);
        const std::span<const int32_t> gpu_pairs(reinterpret_cast<const int32_t*>(pair_bytes.data()), pairs.size());
        if (to_host) {
          gpu.SwapBlocks(gpu_device, gpu_host, gpu_pairs);
          cpu.SwapBlocks(cpu_device_pool, cpu_host_pool, pairs);
        } else {
          gpu.SwapBlocks(gpu_host, gpu_device, gpu_pairs);
          cpu.SwapBlocks(cpu_host_pool, cpu_device_pool, pairs);
        }
        ASSERT_EQ(cudaStreamSynchronize(gpu.stream()), cudaSuccess);
        const absl::Status error = gpu.TakeError();
        ASSERT_TRUE(error.ok()) << error;
        EXPECT_TRUE(host.Bytes() == cpu_host) << (to_host ? "offload" : "onboard") << ": the host pool";
        EXPECT_TRUE(Download(device) == cpu_device) << (to_host ? "offload" : "onboard") << ": the device pool";
      }
    }
  }
}

TEST_F(CudaBackendKernelTest, SwapBlocksWithAPinnedHostPoolMatchesCpu) {
  ExpectSwapsMatchCpu(*gpu_, *cpu_, /*pinned_pool=*/true, /*pinned_pairs=*/true, rng_);
}

TEST_F(CudaBackendKernelTest, SwapBlocksWithAPageableHostPoolOrPairsMatchesCpu) {
  ExpectSwapsMatchCpu(*gpu_, *cpu_, /*pinned_pool=*/false, /*pinned_pairs=*/true, rng_);
  ExpectSwapsMatchCpu(*gpu_, *cpu_, /*pinned_pool=*/true, /*pinned_pairs=*/false, rng_);
}

TEST_F(CudaBackendKernelTest, SwapBlocksRecordsAPairOutsideItsPoolAndCopiesNothing) {
  const int64_t layers = 2, block_bytes = 256;
  const std::vector<std::byte> device0 = RandomBytes(layers * 9 * block_bytes, rng_);
  const std::vector<std::byte> host0 = RandomBytes(layers * 4 * block_bytes, rng_);
  DeviceMemory device = UploadVector(device0);
  HostBytes host(host0.data(), host0.size(), /*pinned=*/true);
  const std::vector<int32_t> pairs = {1, 0, 9, 1};  // block 9 of a 9-block pool
  HostBytes pair_bytes(pairs.data(), sizeof(int32_t) * pairs.size(), /*pinned=*/true);
  gpu_->SwapBlocks(PoolAt(device.get(), layers, 9, block_bytes), PoolAt(host.data(), layers, 4, block_bytes),
                   {reinterpret_cast<const int32_t*>(pair_bytes.data()), pairs.size()});
  ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
  const absl::Status error = gpu_->TakeError();
  EXPECT_EQ(error.code(), absl::StatusCode::kInvalidArgument) << error;
  EXPECT_TRUE(host.Bytes() == host0);
  EXPECT_TRUE(Download(device) == device0);
}

TEST_F(CudaBackendKernelTest, ScatterPairsAndGatherTableRowsMatchCpu) {
  const int64_t row_stride = 6;
  std::vector<int32_t> rows(4 * row_stride);
  std::iota(rows.begin(), rows.end(), 100);
  DeviceMemory d_rows = UploadVector(rows);
  const std::vector<int32_t> updates = {0, -5, 23, 77, 7, 8, 12, 0};
  DeviceMemory d_updates = UploadVector(updates);
  gpu_->ScatterPairs({d_updates.as<int32_t>(), updates.size()}, {d_rows.as<int32_t>(), rows.size()});
  cpu_->ScatterPairs(updates, rows);
  EXPECT_EQ(DownloadVector<int32_t>(d_rows, rows.size()), rows);

  const std::vector<int32_t> rows_of = {3, -1, 0, 2, 1}, context_lens = {17, 50, 0, 96, 200};
  DeviceMemory d_rows_of = UploadVector(rows_of), d_lens = UploadVector(context_lens);
  for (const size_t out_cols : {size_t{4}, size_t{9}}) {  // fewer columns than the stride, and more
    std::vector<int32_t> want(rows_of.size() * out_cols, -7);
    DeviceMemory d_out = UploadVector(want);
    gpu_->GatherTableRows({d_rows.as<int32_t>(), rows.size()}, row_stride, {d_rows_of.as<int32_t>(), rows_of.size()},
                          {d_lens.as<int32_t>(), context_lens.size()}, 16, {d_out.as<int32_t>(), want.size()});
    cpu_->GatherTableRows(rows, row_stride, rows_of, context_lens, 16, want);
    EXPECT_EQ(DownloadVector<int32_t>(d_out, want.size()), want) << "out_cols " << out_cols;
  }
}

// The first recorded error is kept, whichever overload recorded it, and later ops are
// skipped until TakeError returns it; queue() is the stream the ops run on.
TEST_F(CudaBackendKernelTest, RecordErrorKeepsTheFirstAndQueueIsTheStream) {
  EXPECT_EQ(gpu_->queue(), static_cast<void*>(gpu_->stream()));
  const absl::Status reserved = gpu_->ReserveWorkspace({.max_tokens = 256,
                                                        .max_width = 4096,
                                                        .max_seqs = 64,
                                                        .num_heads = 32,
                                                        .num_kv_heads = 8,
                                                        .head_dim = 128,
                                                        .max_context_len = 4096});
  EXPECT_TRUE(reserved.ok()) << reserved;

  Backend& backend = *gpu_;
  backend.RecordError(absl::DataLossError("a corrupt upload"));
  gpu_->RecordError(cudaErrorInvalidValue, "a later launch");
  backend.RecordError(absl::InternalError("a later failure"));
  std::vector<int32_t> array = {1, 2, 3};
  DeviceMemory d_array = UploadVector(array);
  const std::vector<int32_t> updates = {0, 9};
  DeviceMemory d_updates = UploadVector(updates);
  backend.ScatterPairs({d_updates.as<int32_t>(), updates.size()}, {d_array.as<int32_t>(), array.size()});
  EXPECT_EQ(DownloadVector<int32_t>(d_array, array.size()), array) << "an op after the error ran";
  const absl::Status taken = backend.TakeError();
  EXPECT_EQ(taken.code(), absl::StatusCode::kDataLoss) << taken;
  EXPECT_EQ(taken.message(), "a corrupt upload");
  EXPECT_TRUE(backend.TakeError().ok());
}

}  // namespace
}  // namespace kvmesh::backend::cuda
