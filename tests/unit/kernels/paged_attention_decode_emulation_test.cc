// The paged-attention decode kernels' own code (paged_attention_decode_kernel.cuh), run on
// the host by kernels/paged_attention_decode/host_emulation (one std::thread per CUDA thread,
// barriers, emulated warp shuffles), against the CPU backends' PagedAttention. Runs where no
// GPU is, so CI checks the kernels' indexing, paging, GQA head tiling, partitioning, softmax,
// split-K reduce and barrier placement. What it cannot check: the hardware's own semantics
// (device exp2f and fp8 conversion, memory ordering beyond __syncthreads), timing,
// registers, shared-memory limits and bank conflicts; and shared memory starts as the
// previous CTA's leftovers, not poisoned (host_emulation/prelude.h says why).
//
// Pools: f32, bf16 (the backends read the same values) and fp8 e4m3 with per-KV-head scales
// (the backends read the dequantized values as f32), in kv::KvStorage's layout with shuffled
// block tables. Every pool slot that no sequence owns holds NaN, as do the output and the
// split path's workspace at the start, so a kernel using a position past a context or leaving
// an element unwritten fails; unused block-table entries are a block id far out of range.
// Cases: the direct path (one partition) and the split-K + reduce path (contexts 1, 3, 17,
// 300, 513, 1100; a max_context_len above every context), GQA ratios 1, 4, 6 (a CTA with
// masked heads) and 8, head_dim 64 and 128, block sizes 8 and 16. Tolerance as the GPU
// test's (paged_attention_decode_test.cc): max |out - ref| <= 2e-5 * (1 + |ref|). And batch
// invariance: a sequence alone and inside a batch with a larger max_context_len gives the
// same bits (the direct path's and the split path's for a short one).
//
// NOTE: the emulation prelude must be the first include (before any CUDA header).
#include "paged_attention_decode/host_emulation/prelude.h"

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
#include "core/tensor_view.h"
#include "kv/kv_layout.h"
#include "paged_attention_decode/host_emulation/emulated_launch.h"
#include "paged_attention_decode/paged_attention_decode.h"

namespace kvmesh::kernels {
namespace {

constexpr float kTolerance = 2e-5f;
constexpr int32_t kUnusedBlockId = 1 << 30;  // an unused table entry: reading its block crashes
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct DecodeCase {
  std::vector<int32_t> context_lens;
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 16;
  int32_t max_context_len = 0;  // 0: the largest context
};

int32_t MaxContextLen(const DecodeCase& c) {
  return c.max_context_len > 0 ? c.max_context_len : *std::max_element(c.context_lens.begin(), c.context_lens.end());
}
float Scale(const DecodeCase& c) { return 1.f / std::sqrt(static_cast<float>(c.head_dim)); }

// One case's inputs: the pool the kernel reads, the pool the backends read (same values), q.
struct DecodeProblem {
  std::vector<std::byte> kernel_pool;          // one layer, kernel element type; NaN in slots no sequence owns
  std::unique_ptr<kv::KvStorage> oracle_pool;  // one layer: bf16 as stored, else f32 (fp8: dequantized)
  std::vector<float> q;                        // [S, H, D]
  std::vector<int32_t> block_tables;           // [S, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<float> k_scale, v_scale;         // [Hkv]; fp8 only
};

// Shuffled, non-contiguous block tables; returns the number of blocks in the pool.
int32_t FillBlockTables(const DecodeCase& c, std::mt19937& rng, DecodeProblem& p) {
  int32_t used = 0, widest = 0;
  for (int32_t ctx : c.context_lens) {
    used += (ctx + c.block_size - 1) / c.block_size;
    widest = std::max(widest, (ctx + c.block_size - 1) / c.block_size);
  }
  const int32_t num_blocks = used + 3;
  p.max_blocks_per_seq = widest + 1;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.block_tables.assign(c.context_lens.size() * static_cast<size_t>(p.max_blocks_per_seq), kUnusedBlockId);
  auto next_id = ids.begin();
  for (size_t s = 0; s < c.context_lens.size(); ++s) {
    for (int32_t i = 0; i * c.block_size < c.context_lens[s]; ++i) {
      p.block_tables[s * static_cast<size_t>(p.max_blocks_per_seq) + static_cast<size_t>(i)] = *next_id++;
    }
  }
  return num_blocks;
}

// owned[block * B + offset]: some sequence's context holds that slot.
std::vector<bool> OwnedSlots(const DecodeCase& c, const DecodeProblem& p, int32_t num_blocks) {
  std::vector<bool> owned(static_cast<size_t>(num_blocks) * static_cast<size_t>(c.block_size));
  for (size_t s = 0; s < c.context_lens.size(); ++s) {
    for (int32_t pos = 0; pos < c.context_lens[s]; ++pos) {
      const int32_t block =
          p.block_tables[s * static_cast<size_t>(p.max_blocks_per_seq) + static_cast<size_t>(pos / c.block_size)];
      owned[static_cast<size_t>(block * c.block_size + pos % c.block_size)] = true;
    }
  }
  return owned;
}

// Stores x at element `e` of the kernel's pool; returns the value the kernel decodes there.
float StoreKernelElement(KvCacheDType dtype, float x, float fp8_scale, std::byte* pool, int64_t e) {
  if (dtype == KvCacheDType::kF32) {
    std::memcpy(pool + e * 4, &x, 4);
    return x;
  }
  if (dtype == KvCacheDType::kBf16) {
    const uint16_t bits = F32ToBf16(x);
    std::memcpy(pool + e * 2, &bits, 2);
    return Bf16ToF32(bits);
  }
  const uint8_t bits = std::isnan(x) ? uint8_t{0x7f} : F32ToFp8E4M3(x / fp8_scale);
  pool[e] = static_cast<std::byte>(bits);
  return Fp8E4M3ToF32(bits) * fp8_scale;
}

DecodeProblem MakeProblem(const DecodeCase& c, KvCacheDType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  DecodeProblem p;
  const int32_t num_blocks = FillBlockTables(c, rng, p);
  const std::vector<bool> owned = OwnedSlots(c, p, num_blocks);
  const bool fp8 = dtype == KvCacheDType::kFp8E4M3;
  for (int32_t h = 0; fp8 && h < c.num_kv_heads; ++h) {
    p.k_scale.push_back(0.011f + 0.003f * static_cast<float>(h));
    p.v_scale.push_back(0.013f + 0.002f * static_cast<float>(h));
  }
  kv::KvLayoutOptions shape{.num_layers = 1,
                            .num_kv_heads = c.num_kv_heads,
                            .head_dim = c.head_dim,
                            .block_size_tokens = c.block_size,
                            .dtype = dtype == KvCacheDType::kBf16 ? DType::kBF16 : DType::kF32,
                            .num_blocks = num_blocks};
  p.oracle_pool = kv::KvStorage::Create(shape).value();
  shape.dtype = fp8 ? DType::kFP8E4M3 : shape.dtype;
  const int64_t block_bytes = kv::KvLayout::Create(shape).value().BlockBytes();
  p.kernel_pool.resize(static_cast<size_t>(block_bytes * num_blocks));
  // A block: [2 (K, V)][Hkv][B x D]; K heads dimension-major, V heads token-major.
  const int64_t head_elems = int64_t{c.block_size} * c.head_dim;
  for (int32_t b = 0; b < num_blocks; ++b) {
    std::byte* oracle_block = p.oracle_pool->BlockData(0, kv::BlockId{b}).data();
    std::byte* kernel_block = p.kernel_pool.data() + b * block_bytes;
    for (int32_t kvi = 0; kvi < 2; ++kvi) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int64_t r = 0; r < head_elems; ++r) {
          const int64_t offset = kvi == 0 ? r % c.block_size : r / c.head_dim;
          const bool is_owned = owned[static_cast<size_t>(b * c.block_size + offset)];
          const int64_t e = (int64_t{kvi} * c.num_kv_heads + h) * head_elems + r;
          const float fp8_scale = fp8 ? (kvi == 0 ? p.k_scale : p.v_scale)[static_cast<size_t>(h)] : 1.f;
          // The backends get a finite value everywhere; the kernel, NaN where no sequence owns the slot.
          const float value = StoreKernelElement(dtype, normal(rng), fp8_scale, kernel_block, e);
          if (!is_owned) StoreKernelElement(dtype, kNaN, fp8_scale, kernel_block, e);
          if (dtype == KvCacheDType::kBf16) {
            const uint16_t bits = F32ToBf16(value);
            std::memcpy(oracle_block + e * 2, &bits, 2);
          } else {
            std::memcpy(oracle_block + e * 4, &value, 4);
          }
        }
      }
    }
  }
  p.q.resize(c.context_lens.size() * static_cast<size_t>(c.num_heads * c.head_dim));
  for (float& x : p.q) x = 2.f * normal(rng);  // logits of spread ~2: a peaked softmax, not a flat one
  return p;
}

// Runs the emulated kernels on `p`; the output starts as NaN.
std::vector<float> RunEmulated(const DecodeCase& c, KvCacheDType dtype, const DecodeProblem& p) {
  std::vector<float> out(p.q.size(), kNaN);
  const PagedAttentionDecodeArgs args{
      .q = p.q.data(),
      .kv_cache = p.kernel_pool.data(),
      .context_lens = c.context_lens.data(),
      .block_tables = p.block_tables.data(),
      .k_scale = p.k_scale.empty() ? nullptr : p.k_scale.data(),
      .v_scale = p.v_scale.empty() ? nullptr : p.v_scale.data(),
      .out = out.data(),
      .num_seqs = static_cast<int32_t>(c.context_lens.size()),
      .num_heads = c.num_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim = c.head_dim,
      .block_size_tokens = c.block_size,
      .max_blocks_per_seq = p.max_blocks_per_seq,
      .max_context_len = MaxContextLen(c),
      .scale = Scale(c),
      .kv_dtype = dtype,
  };
  EXPECT_EQ(host_emulation::EmulatePagedAttentionDecode(args), cudaSuccess);
  return out;
}

std::vector<float> RunOracle(backend::Backend& oracle, const DecodeCase& c, const DecodeProblem& p) {
  const auto num_seqs = static_cast<int32_t>(c.context_lens.size());
  std::vector<int32_t> query_start(c.context_lens.size() + 1);
  std::iota(query_start.begin(), query_start.end(), 0);  // one query row per sequence
  std::vector<float> q = p.q;
  std::vector<float> out(q.size());
  const backend::PagedAttentionBatch batch{
      .query_start = query_start,
      .context_lens = c.context_lens,
      .block_tables = p.block_tables,
      .max_blocks_per_seq = p.max_blocks_per_seq,
      .max_query_len = 1,
      .max_context_len = *std::max_element(c.context_lens.begin(), c.context_lens.end())};
  oracle.PagedAttention(TensorView::Contiguous(q.data(), DType::kF32, {num_seqs, c.num_heads, c.head_dim}),
                        p.oracle_pool->LayerView(0), batch, Scale(c),
                        TensorView::Contiguous(out.data(), DType::kF32, {num_seqs, c.num_heads, c.head_dim}));
  return out;
}

const char* DTypeName(KvCacheDType t) {
  return t == KvCacheDType::kF32 ? "F32" : t == KvCacheDType::kBf16 ? "Bf16" : "Fp8";
}

class PagedAttentionDecodeEmulationKernelTest : public ::testing::TestWithParam<KvCacheDType> {};

TEST_P(PagedAttentionDecodeEmulationKernelTest, KernelCodeMatchesCpuBackendsOnHost) {
  const KvCacheDType dtype = GetParam();
  std::vector<std::unique_ptr<backend::Backend>> oracles;
  oracles.push_back(backend::CreateReferenceBackend());
  oracles.push_back(backend::CreateCpuBackend({}).value());
  const std::vector<DecodeCase> cases = {
      // The direct path (one partition), MHA, head_dim 64; lengths not multiples of B.
      {.context_lens = {1, 17, 300}, .num_heads = 2, .num_kv_heads = 2, .head_dim = 64},
      // Split-K + reduce, GQA 4, head_dim 128: 513 is one token into partition 1, 1100 in
      // partition 2, 17 alone in partition 0 with two empty ones after it.
      {.context_lens = {513, 1100, 17}, .num_heads = 8, .num_kv_heads = 2, .head_dim = 128},
      // GQA 8, block size 8, max_context_len above every context (empty partitions).
      {.context_lens = {1100, 1}, .num_heads = 8, .num_kv_heads = 1, .head_dim = 64, .block_size = 8,
       .max_context_len = 1600},
      // A group of 6 in a CTA of 8 query heads (two masked), split.
      {.context_lens = {3, 513}, .num_heads = 6, .num_kv_heads = 1, .head_dim = 64},
  };
  uint32_t seed = 1;
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "H " << c.num_heads << " Hkv " << c.num_kv_heads << " D " << c.head_dim
                                      << " B " << c.block_size << " seqs " << c.context_lens.size()
                                      << " max_context_len " << MaxContextLen(c));
    const DecodeProblem p = MakeProblem(c, dtype, seed++);
    const std::vector<float> emulated = RunEmulated(c, dtype, p);
    for (const auto& oracle : oracles) {
      SCOPED_TRACE(oracle->name());
      const std::vector<float> ref = RunOracle(*oracle, c, p);
      int bad = 0;
      for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
        if (!(std::fabs(emulated[i] - ref[i]) <= kTolerance * (1.f + std::fabs(ref[i])))) {
          ++bad;
          const size_t row = i / static_cast<size_t>(c.head_dim);
          ADD_FAILURE() << "seq " << row / static_cast<size_t>(c.num_heads) << " head "
                        << row % static_cast<size_t>(c.num_heads) << " dim " << i % static_cast<size_t>(c.head_dim)
                        << ": emulated " << emulated[i] << " ref " << ref[i];
        }
      }
    }
  }
}

// Each sequence alone (its own max_context_len: the direct path for 17, fewer partitions for
// the others) and inside a batch with max_context_len 2000 (four partitions): the same bits.
TEST_P(PagedAttentionDecodeEmulationKernelTest, SequenceResultDoesNotDependOnTheBatch) {
  const KvCacheDType dtype = GetParam();
  const DecodeCase batch{
      .context_lens = {1100, 17, 513}, .num_heads = 8, .num_kv_heads = 1, .head_dim = 128, .max_context_len = 2000};
  const DecodeProblem p = MakeProblem(batch, dtype, 99);
  const std::vector<float> batched = RunEmulated(batch, dtype, p);
  const size_t row = static_cast<size_t>(batch.num_heads * batch.head_dim);
  const auto table_row = static_cast<size_t>(p.max_blocks_per_seq);
  for (size_t s = 0; s < batch.context_lens.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "sequence " << s << " context " << batch.context_lens[s]);
    DecodeCase alone = batch;
    alone.context_lens = {batch.context_lens[s]};
    alone.max_context_len = 0;
    // The same pool; this sequence's q row and block-table row as a batch of one.
    DecodeProblem one{.kernel_pool = p.kernel_pool,
                      .q = {p.q.begin() + static_cast<ptrdiff_t>(s * row), p.q.begin() + static_cast<ptrdiff_t>((s + 1) * row)},
                      .block_tables = {p.block_tables.begin() + static_cast<ptrdiff_t>(s * table_row),
                                       p.block_tables.begin() + static_cast<ptrdiff_t>((s + 1) * table_row)},
                      .max_blocks_per_seq = p.max_blocks_per_seq,
                      .k_scale = p.k_scale,
                      .v_scale = p.v_scale};
    const std::vector<float> single = RunEmulated(alone, dtype, one);
    ASSERT_EQ(single.size(), row);
    EXPECT_TRUE(std::none_of(single.begin(), single.end(), [](float x) { return std::isnan(x); }));
    EXPECT_EQ(std::memcmp(single.data(), batched.data() + s * row, row * sizeof(float)), 0)
        << "first value alone " << single[0] << ", batched " << batched[s * row];
  }
}

INSTANTIATE_TEST_SUITE_P(PoolDTypes, PagedAttentionDecodeEmulationKernelTest,
                         ::testing::Values(KvCacheDType::kF32, KvCacheDType::kBf16, KvCacheDType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<KvCacheDType>& info) { return DTypeName(info.param); });

}  // namespace
}  // namespace kvmesh::kernels
