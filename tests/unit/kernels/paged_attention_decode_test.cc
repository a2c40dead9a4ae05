// The CUDA paged-attention decode kernel against the CPU backends' PagedAttention (one
// query row per sequence: query_start = 0, 1, ..., num_seqs), on pools laid out by
// kv::KvStorage (two layers; the kernel reads layer 1) with shuffled, non-contiguous block
// tables. Pools: f32 and bf16 (the backends read the same bytes) and fp8 e4m3 with
// per-KV-head scales (the backends read an f32 pool of the dequantized values).
// Tolerance: max |gpu - ref| <= 2e-5 * (1 + |ref|) (f32 rounding of another summation
// order only). The slack positions past each context in its last block hold NaN in the
// GPU's pool, unused block-table entries a block id far out of range, and the output and
// workspace start as NaN, so reading past a context or leaving an element unwritten fails.
// Also: a sequence's output is bitwise the same alone and inside a batch with a larger
// max_context_len (batch invariance), and bad shapes give cudaErrorInvalidValue.
// Skips where no GPU is present (CI), saying why.
#include "paged_attention_decode/paged_attention_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

constexpr float kTolerance = 2e-5f;
constexpr int32_t kFarBlockId = 1 << 30;  // unused table entries: a read of one faults

struct DecodeCase {
  std::vector<int32_t> context_lens;
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 16;
  int32_t max_context_len = 0;  // 0: the largest context
};

// One case's host data: the pool bytes the GPU reads, the pool the oracles read, q and tables.
struct HostProblem {
  std::unique_ptr<kv::KvStorage> oracle_pool;  // f32 or bf16; for fp8 the dequantized f32 values
  std::vector<std::byte> gpu_pool;             // the whole 2-layer pool in the kernel's element type
  int64_t gpu_layer_bytes = 0;
  std::vector<float> q;                        // [S, H, D]
  std::vector<int32_t> block_tables;           // [S, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<float> k_scale, v_scale;         // [Hkv], fp8 only
};

DType OracleDType(KvCacheDType t) { return t == KvCacheDType::kBf16 ? DType::kBF16 : DType::kF32; }
int64_t ElementBytes(KvCacheDType t) { return t == KvCacheDType::kF32 ? 4 : t == KvCacheDType::kBf16 ? 2 : 1; }

HostProblem MakeProblem(const DecodeCase& c, KvCacheDType dtype, uint32_t seed) {
  HostProblem hp;
  std::mt19937 rng(seed);
  const int32_t num_seqs = static_cast<int32_t>(c.context_lens.size());
  std::vector<int32_t> blocks_needed;
  for (int32_t ctx : c.context_lens) blocks_needed.push_back((ctx + c.block_size - 1) / c.block_size);
  hp.max_blocks_per_seq = *std::max_element(blocks_needed.begin(), blocks_needed.end()) + 2;
  const int32_t used = std::accumulate(blocks_needed.begin(), blocks_needed.end(), 0);
  const int32_t num_blocks = used + 5;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  hp.block_tables.assign(static_cast<size_t>(num_seqs) * static_cast<size_t>(hp.max_blocks_per_seq), kFarBlockId);
  size_t next = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    for (int32_t i = 0; i < blocks_needed[static_cast<size_t>(s)]; ++i) {
      hp.block_tables[static_cast<size_t>(s * hp.max_blocks_per_seq + i)] = ids[next++];
    }
  }

  const kv::KvLayoutOptions shape{.num_layers = 2,
                                  .num_kv_heads = c.num_kv_heads,
                                  .head_dim = c.head_dim,
                                  .block_size_tokens = c.block_size,
                                  .dtype = OracleDType(dtype),
                                  .num_blocks = num_blocks};
  hp.oracle_pool = kv::KvStorage::Create(shape).value();
  const DType gpu_dtype = dtype == KvCacheDType::kFp8E4M3 ? DType::kFP8E4M3 : OracleDType(dtype);
  kv::KvLayoutOptions gpu_shape = shape;
  gpu_shape.dtype = gpu_dtype;
  auto gpu_storage = kv::KvStorage::Create(gpu_shape).value();
  hp.gpu_layer_bytes = gpu_storage->layout().LayerBytes();

  std::normal_distribution<float> normal;
  if (dtype == KvCacheDType::kFp8E4M3) {
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      hp.k_scale.push_back(0.011f + 0.003f * static_cast<float>(h));
      hp.v_scale.push_back(0.013f + 0.002f * static_cast<float>(h));
    }
  }
  // Every element of both layers: random, in each pool's encoding.
  const int64_t head_elems = int64_t{c.block_size} * c.head_dim;
  const int64_t esize = ElementBytes(dtype);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t b = 0; b < num_blocks; ++b) {
      std::byte* oracle_block = hp.oracle_pool->BlockData(layer, kv::BlockId{b}).data();
      std::byte* gpu_block = gpu_storage->BlockData(layer, kv::BlockId{b}).data();
      for (int32_t kvi = 0; kvi < 2; ++kvi) {
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          for (int64_t r = 0; r < head_elems; ++r) {
            const int64_t e = (int64_t{kvi} * c.num_kv_heads + h) * head_elems + r;
            const float x = normal(rng);
            if (dtype == KvCacheDType::kF32) {
              std::memcpy(oracle_block + e * 4, &x, 4);
              std::memcpy(gpu_block + e * 4, &x, 4);
            } else if (dtype == KvCacheDType::kBf16) {
              const uint16_t bits = F32ToBf16(x);
              std::memcpy(oracle_block + e * 2, &bits, 2);
              std::memcpy(gpu_block + e * 2, &bits, 2);
            } else {
              const float head_scale = (kvi == 0 ? hp.k_scale : hp.v_scale)[static_cast<size_t>(h)];
              const uint8_t bits = F32ToFp8E4M3(x / head_scale);
              const float dequantized = Fp8E4M3ToF32(bits) * head_scale;
              std::memcpy(oracle_block + e * 4, &dequantized, 4);
              gpu_block[e] = static_cast<std::byte>(bits);
            }
          }
        }
      }
    }
  }
  hp.gpu_pool.assign(gpu_storage->data(), gpu_storage->data() + gpu_storage->size_bytes());
  // NaN in the slack of each sequence's last block (layer 1, GPU pool only: the oracles
  // never see it, the kernel must not use it).
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t ctx = c.context_lens[static_cast<size_t>(s)];
    const int32_t last = hp.block_tables[static_cast<size_t>(s * hp.max_blocks_per_seq + (ctx - 1) / c.block_size)];
    std::byte* block = hp.gpu_pool.data() + hp.gpu_layer_bytes + int64_t{last} * gpu_storage->layout().BlockBytes();
    for (int32_t off = (ctx - 1) % c.block_size + 1; off < c.block_size; ++off) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const int64_t k_e = int64_t{h} * head_elems + int64_t{d} * c.block_size + off;
          const int64_t v_e = (int64_t{c.num_kv_heads} + h) * head_elems + int64_t{off} * c.head_dim + d;
          for (int64_t e : {k_e, v_e}) {
            if (esize == 4) {
              const float nan = std::numeric_limits<float>::quiet_NaN();
              std::memcpy(block + e * 4, &nan, 4);
            } else if (esize == 2) {
              const uint16_t nan = 0x7fc0;
              std::memcpy(block + e * 2, &nan, 2);
            } else {
              block[e] = std::byte{0x7f};
            }
          }
        }
      }
    }
  }
  hp.q.resize(static_cast<size_t>(num_seqs) * static_cast<size_t>(c.num_heads) * static_cast<size_t>(c.head_dim));
  for (float& x : hp.q) x = 2.f * normal(rng);  // logits of spread ~2: a peaked softmax, not a flat one
  return hp;
}

float Scale(const DecodeCase& c) { return 1.f / std::sqrt(static_cast<float>(c.head_dim)); }

// Runs the kernel on `hp`; out and workspace start as NaN.
std::vector<float> RunGpu(const DecodeCase& c, KvCacheDType dtype, const HostProblem& hp) {
  const int32_t num_seqs = static_cast<int32_t>(c.context_lens.size());
  DeviceBuffer<std::byte> pool(hp.gpu_pool);
  DeviceBuffer<float> q(hp.q);
  DeviceBuffer<int32_t> lens(c.context_lens);
  DeviceBuffer<int32_t> tables(hp.block_tables);
  DeviceBuffer<float> k_scale(hp.k_scale.empty() ? std::vector<float>{1.f} : hp.k_scale);
  DeviceBuffer<float> v_scale(hp.v_scale.empty() ? std::vector<float>{1.f} : hp.v_scale);
  DeviceBuffer<float> out(std::vector<float>(hp.q.size(), std::numeric_limits<float>::quiet_NaN()));
  const int32_t max_len = c.max_context_len > 0 ? c.max_context_len
                                                 : *std::max_element(c.context_lens.begin(), c.context_lens.end());
  PagedAttentionDecodeArgs args{
      .q = q.get(),
      .kv_cache = pool.get() + hp.gpu_layer_bytes,
      .context_lens = lens.get(),
      .block_tables = tables.get(),
      .k_scale = dtype == KvCacheDType::kFp8E4M3 ? k_scale.get() : nullptr,
      .v_scale = dtype == KvCacheDType::kFp8E4M3 ? v_scale.get() : nullptr,
      .out = out.get(),
      .num_seqs = num_seqs,
      .num_heads = c.num_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim = c.head_dim,
      .block_size_tokens = c.block_size,
      .max_blocks_per_seq = hp.max_blocks_per_seq,
      .max_context_len = max_len,
      .scale = Scale(c),
      .kv_dtype = dtype,
  };
  const size_t ws_bytes = PagedAttentionDecodeWorkspaceBytes(args);
  DeviceBuffer<float> workspace(std::vector<float>(std::max<size_t>(ws_bytes / sizeof(float), 1),
                                                   std::numeric_limits<float>::quiet_NaN()));
  EXPECT_EQ(LaunchPagedAttentionDecode(args, ws_bytes > 0 ? workspace.get() : nullptr, ws_bytes, nullptr),
            cudaSuccess);
  return out.Download();
}

std::vector<float> RunOracle(backend::Backend& oracle, const DecodeCase& c, HostProblem& hp) {
  const int32_t num_seqs = static_cast<int32_t>(c.context_lens.size());
  std::vector<int32_t> query_start(static_cast<size_t>(num_seqs) + 1);
  std::iota(query_start.begin(), query_start.end(), 0);
  std::vector<float> q = hp.q;
  std::vector<float> out(q.size());
  const backend::PagedAttentionBatch batch{.query_start = query_start,
                                           .context_lens = c.context_lens,
                                           .block_tables = hp.block_tables,
                                           .max_blocks_per_seq = hp.max_blocks_per_seq,
                                           .max_query_len = 1,
                                           .max_context_len = *std::max_element(c.context_lens.begin(),
                                                                                c.context_lens.end())};
  oracle.PagedAttention(TensorView::Contiguous(q.data(), DType::kF32, {num_seqs, c.num_heads, c.head_dim}),
                        hp.oracle_pool->LayerView(1), batch, Scale(c),
                        TensorView::Contiguous(out.data(), DType::kF32, {num_seqs, c.num_heads, c.head_dim}));
  return out;
}

const char* DTypeName(KvCacheDType t) {
  return t == KvCacheDType::kF32 ? "F32" : t == KvCacheDType::kBf16 ? "Bf16" : "Fp8";
}

class PagedAttentionDecodeKernelTest : public ::testing::TestWithParam<KvCacheDType> {};

TEST_P(PagedAttentionDecodeKernelTest, MatchesCpuBackends) {
  KVMESH_SKIP_WITHOUT_GPU();
  const KvCacheDType dtype = GetParam();
  std::vector<std::unique_ptr<backend::Backend>> oracles;
  oracles.push_back(backend::CreateReferenceBackend());
  if (auto cpu = backend::CreateCpuBackend({}); cpu.ok()) oracles.push_back(std::move(cpu).value());
  const std::vector<DecodeCase> cases = {
      // Mixed lengths (not multiples of B), below and above one 512-token partition, GQA 4.
      {.context_lens = {1, 17, 257, 1000, 4097, 513, 512}, .num_heads = 16, .num_kv_heads = 4, .head_dim = 128},
      // One sequence, no split (direct path), MHA, head_dim 64.
      {.context_lens = {257}, .num_heads = 4, .num_kv_heads = 4, .head_dim = 64},
      // One sequence, split, GQA 8.
      {.context_lens = {4097}, .num_heads = 16, .num_kv_heads = 2, .head_dim = 128},
      // max_context_len far above the actual lengths (empty partitions), GQA 8, head_dim 64.
      {.context_lens = {1, 17, 1000, 257, 33, 4097, 600},
       .num_heads = 8,
       .num_kv_heads = 1,
       .head_dim = 64,
       .max_context_len = 40000},
      // A batch that fits one partition but whose max_context_len does not.
      {.context_lens = {1, 17, 257}, .num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .max_context_len = 1500},
      // Block sizes 8 and 32.
      {.context_lens = {1000, 1, 17}, .num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 8},
      {.context_lens = {17, 1000, 4097}, .num_heads = 4, .num_kv_heads = 1, .head_dim = 64, .block_size = 32},
      // Groups that are not 1, 2, 4 or 8: 6 (a CTA with masked heads) and 16 (two CTAs per KV head); 2.
      {.context_lens = {700, 3}, .num_heads = 12, .num_kv_heads = 2, .head_dim = 128},
      {.context_lens = {1025, 40}, .num_heads = 32, .num_kv_heads = 2, .head_dim = 64},
      {.context_lens = {1, 511, 1024}, .num_heads = 4, .num_kv_heads = 2, .head_dim = 64},
  };
  uint32_t seed = 1;
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "H " << c.num_heads << " Hkv " << c.num_kv_heads << " D " << c.head_dim
                                      << " B " << c.block_size << " seqs " << c.context_lens.size()
                                      << " max_context_len " << c.max_context_len);
    HostProblem hp = MakeProblem(c, dtype, seed++);
    const std::vector<float> gpu = RunGpu(c, dtype, hp);
    for (const auto& oracle : oracles) {
      SCOPED_TRACE(oracle->name());
      const std::vector<float> ref = RunOracle(*oracle, c, hp);
      int bad = 0;
      for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
        const float diff = std::fabs(gpu[i] - ref[i]);
        if (!(diff <= kTolerance * (1.f + std::fabs(ref[i])))) {
          ++bad;
          const size_t row = i / static_cast<size_t>(c.head_dim);
          ADD_FAILURE() << "seq " << row / static_cast<size_t>(c.num_heads) << " head "
                        << row % static_cast<size_t>(c.num_heads) << " dim " << i % static_cast<size_t>(c.head_dim)
                        << ": gpu " << gpu[i] << " ref " << ref[i];
        }
      }
    }
  }
}

// A sequence alone (its own max_context_len: one partition, the direct path, when short)
// and inside a batch of others with max_context_len 20000 (the split path): the same bits.
TEST_P(PagedAttentionDecodeKernelTest, SequenceResultDoesNotDependOnTheBatch) {
  KVMESH_SKIP_WITHOUT_GPU();
  const KvCacheDType dtype = GetParam();
  const DecodeCase batch{.context_lens = {4097, 1, 300, 1000, 17, 513, 2049},
                         .num_heads = 32,
                         .num_kv_heads = 8,
                         .head_dim = 128,
                         .max_context_len = 20000};
  HostProblem hp = MakeProblem(batch, dtype, 99);
  const std::vector<float> batched = RunGpu(batch, dtype, hp);
  const size_t row = static_cast<size_t>(batch.num_heads) * static_cast<size_t>(batch.head_dim);
  for (size_t s = 0; s < batch.context_lens.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "sequence " << s << " context " << batch.context_lens[s]);
    // The same pool, q row and block-table row, as a batch of one.
    DecodeCase alone = batch;
    alone.context_lens = {batch.context_lens[s]};
    alone.max_context_len = 0;
    HostProblem one;
    one.gpu_pool = hp.gpu_pool;
    one.gpu_layer_bytes = hp.gpu_layer_bytes;
    one.max_blocks_per_seq = hp.max_blocks_per_seq;
    one.k_scale = hp.k_scale;
    one.v_scale = hp.v_scale;
    one.q.assign(hp.q.begin() + static_cast<ptrdiff_t>(s * row), hp.q.begin() + static_cast<ptrdiff_t>((s + 1) * row));
    const auto table_row = static_cast<ptrdiff_t>(s * static_cast<size_t>(hp.max_blocks_per_seq));
    one.block_tables.assign(hp.block_tables.begin() + table_row,
                            hp.block_tables.begin() + table_row + hp.max_blocks_per_seq);
    const std::vector<float> single = RunGpu(alone, dtype, one);
    ASSERT_EQ(single.size(), row);
    EXPECT_EQ(std::memcmp(single.data(), batched.data() + s * row, row * sizeof(float)), 0)
        << "first value alone " << single[0] << ", batched " << batched[s * row];
  }
}

INSTANTIATE_TEST_SUITE_P(PoolDTypes, PagedAttentionDecodeKernelTest,
                         ::testing::Values(KvCacheDType::kF32, KvCacheDType::kBf16, KvCacheDType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<KvCacheDType>& info) { return DTypeName(info.param); });

// Argument checks happen on the host before any launch: no GPU needed.
TEST(PagedAttentionDecodeKernelArgsTest, BadShapesAreInvalidValue) {
  alignas(16) static float dummy[64];
  const PagedAttentionDecodeArgs good{.q = dummy,
                                      .kv_cache = dummy,
                                      .context_lens = reinterpret_cast<const int32_t*>(dummy),
                                      .block_tables = reinterpret_cast<const int32_t*>(dummy),
                                      .out = dummy,
                                      .num_seqs = 2,
                                      .num_heads = 8,
                                      .num_kv_heads = 2,
                                      .head_dim = 128,
                                      .block_size_tokens = 16,
                                      .max_blocks_per_seq = 4,
                                      .max_context_len = 64,
                                      .scale = 0.1f,
                                      .kv_dtype = KvCacheDType::kBf16};
  auto expect_invalid = [](PagedAttentionDecodeArgs a, const char* what) {
    EXPECT_EQ(LaunchPagedAttentionDecode(a, nullptr, 0, nullptr), cudaErrorInvalidValue) << what;
  };
  PagedAttentionDecodeArgs a = good;
  a.num_heads = 6;
  a.num_kv_heads = 4;
  expect_invalid(a, "num_heads % num_kv_heads");
  a = good;
  a.head_dim = 96;
  expect_invalid(a, "head_dim 96");
  a = good;
  a.block_size_tokens = 12;
  expect_invalid(a, "block size 12");
  a = good;
  a.block_size_tokens = 4;
  expect_invalid(a, "block size 4");
  a = good;
  a.num_seqs = 0;
  expect_invalid(a, "no sequences");
  a = good;
  a.max_context_len = 0;
  expect_invalid(a, "max_context_len 0");
  a = good;
  a.q = nullptr;
  expect_invalid(a, "null q");
  a = good;
  a.kv_dtype = KvCacheDType::kFp8E4M3;
  expect_invalid(a, "fp8 without scales");
  a = good;
  a.kv_cache = reinterpret_cast<const char*>(dummy) + 4;
  expect_invalid(a, "misaligned pool");
  a = good;
  a.max_context_len = 513;  // two partitions: needs a workspace
  ASSERT_GT(PagedAttentionDecodeWorkspaceBytes(a), 0u);
  EXPECT_EQ(LaunchPagedAttentionDecode(a, dummy, PagedAttentionDecodeWorkspaceBytes(a) - 4, nullptr),
            cudaErrorInvalidValue);
  expect_invalid(a, "no workspace");
}

TEST(PagedAttentionDecodeKernelArgsTest, WorkspaceOnlyWhenSplit) {
  PagedAttentionDecodeArgs a{.num_seqs = 3, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_context_len = 512};
  EXPECT_EQ(PagedAttentionDecodeWorkspaceBytes(a), 0u);
  a.max_context_len = 1025;  // 3 partitions
  EXPECT_EQ(PagedAttentionDecodeWorkspaceBytes(a), size_t{3} * 8 * 3 * (64 + 2) * sizeof(float));
}

}  // namespace
}  // namespace kvmesh::kernels
