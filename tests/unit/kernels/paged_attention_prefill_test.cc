// The CUDA prefill attention kernel against the CPU backend's PagedAttention on the same pool
// (kv::KvStorage layout, shuffled block tables) for f32, bf16 and FP8 e4m3 pools: 1 and 257
// query tokens, cached prefixes (prefix 100 + chunk 37), lengths that are not multiples of
// the block size, mixed batches of prefill chunks and decode rows (n_s = 1), GQA ratios 1/4/8,
// head_dim 64 and 128, block sizes 8/16/24/32/128, a max_query_len above every n_s, and both
// warp shapes (16 query rows per warp, the default, and 32).
//
// Oracle inputs: the f32 pool as is; the bf16 pool as stored (the CPU backend reads bf16);
// the FP8 pool decoded on the host (Fp8E4M3ToF32 * the head's scale) into an f32 pool. The
// kernel rounds q (and an f32 pool's K/V) to bf16 and multiplies on tensor cores, so for
// every pool type: max |out - ref| <= 2e-2 * max(1, max |ref|) and ||out - ref|| / ||ref||
// <= 1e-2 (bf16 operands land between 1e-3 and 1e-2; METHOD.md). The output starts as NaN
// and NaN never passes; every slot of the device pool that no sequence owns holds NaN too,
// so a kernel reading past a context (or using P = 0 on a NaN V) fails.
//
// The GPU cases skip where no GPU is present (CI), saying why. Two parts run everywhere: the
// launcher's shape checks, and the kernel's own code run on the host by
// kernels/paged_attention_prefill/host_emulation (emulated warps and tensor-core fragments)
// on smaller cases, against the same oracle with the same tolerance.
//
// NOTE: the emulation prelude must come before any CUDA header, and the build puts
// host_emulation/ first on this test's include path (it shadows mma_bf16.cuh).
#include "paged_attention_prefill/host_emulation/prelude.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "cuda_test_util.h"
#include "kv/kv_layout.h"
#include "paged_attention_prefill/host_emulation/emulated_launch.h"
#include "paged_attention_prefill/paged_attention_prefill.h"

namespace kvmesh::kernels {
namespace {

using test_util::DeviceBuffer;

struct SeqShape {
  int32_t prefix, new_tokens;  // context = prefix + new_tokens
};

struct PrefillCase {
  int32_t heads, kv_heads, head_dim, block_size;
  std::vector<SeqShape> seqs;
  int32_t extra_query_len = 0;  // max_query_len = max n_s + this
};

DType PoolDType(KvCacheDType d) {
  switch (d) {
    case KvCacheDType::kF32: return DType::kF32;
    case KvCacheDType::kBf16: return DType::kBF16;
    case KvCacheDType::kFp8E4M3: return DType::kFP8E4M3;
  }
  return DType::kF32;
}

const char* PoolName(KvCacheDType d) {
  switch (d) {
    case KvCacheDType::kF32: return "F32";
    case KvCacheDType::kBf16: return "Bf16";
    case KvCacheDType::kFp8E4M3: return "Fp8";
  }
  return "?";
}

// Writes element (slot, kv, head, dim) of a pool in kv_layout.h's layout.
template <typename T>
void PutElement(kv::KvStorage& storage, int64_t slot, int32_t kv, int32_t head, int32_t dim, T value) {
  const kv::KvLayout& layout = storage.layout();
  const int64_t stride = kv == 0 ? layout.block_size_tokens() : 1;  // K is dimension-major
  const int64_t at = layout.SlotOffset(0, kv, head, slot) + dim * stride * static_cast<int64_t>(sizeof(T));
  std::memcpy(storage.data() + at, &value, sizeof(T));
}

// One case's inputs (host memory) and the oracle's output.
struct PreparedCase {
  std::vector<int32_t> query_start, context_lens, block_tables;
  std::unique_ptr<kv::KvStorage> pool;  // the kernel's pool: the case's element type, NaN where unwritten
  std::vector<float> q, k_scale, v_scale, ref;
  PagedAttentionPrefillArgs args;  // shapes set; pointers left for the runner
};

PreparedCase Prepare(const PrefillCase& c, KvCacheDType kv_dtype, uint32_t seed) {
  const int32_t num_seqs = static_cast<int32_t>(c.seqs.size());
  const int32_t bsz = c.block_size;
  std::mt19937 rng(seed);

  // Sequences: query rows, contexts, and blocks handed out in a shuffled order.
  std::vector<int32_t> query_start{0}, context_lens;
  int32_t max_n = 0, max_blocks = 0, total_blocks = 0;
  for (const SeqShape& s : c.seqs) {
    const int32_t ctx = s.prefix + s.new_tokens;
    query_start.push_back(query_start.back() + s.new_tokens);
    context_lens.push_back(ctx);
    max_n = std::max(max_n, s.new_tokens);
    max_blocks = std::max(max_blocks, (ctx + bsz - 1) / bsz);
    total_blocks += (ctx + bsz - 1) / bsz;
  }
  const int32_t num_tokens = query_start.back();
  const int32_t max_blocks_per_seq = max_blocks + 1;  // one spare column, never valid
  const int32_t num_blocks = total_blocks + 3;        // blocks nobody owns stay NaN
  std::vector<int32_t> block_ids(static_cast<size_t>(num_blocks));
  std::iota(block_ids.begin(), block_ids.end(), 0);
  std::shuffle(block_ids.begin(), block_ids.end(), rng);
  std::vector<int32_t> block_tables(static_cast<size_t>(num_seqs) * static_cast<size_t>(max_blocks_per_seq), -1);
  size_t next_block = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    for (int32_t b = 0; b < (context_lens[static_cast<size_t>(s)] + bsz - 1) / bsz; ++b) {
      block_tables[static_cast<size_t>(s * max_blocks_per_seq + b)] = block_ids[next_block++];
    }
  }

  // The device pool (the case's element type, NaN where no position is written) and the
  // oracle's pool (bf16 for a bf16 pool, else f32 holding exactly what the kernel decodes).
  const DType dev_dtype = PoolDType(kv_dtype);
  const DType oracle_dtype = kv_dtype == KvCacheDType::kBf16 ? DType::kBF16 : DType::kF32;
  auto make_storage = [&](DType dtype) {
    return kv::KvStorage::Create({.num_layers = 1,
                                  .num_kv_heads = c.kv_heads,
                                  .head_dim = c.head_dim,
                                  .block_size_tokens = bsz,
                                  .dtype = dtype,
                                  .num_blocks = num_blocks})
        .value();
  };
  std::unique_ptr<kv::KvStorage> dev_pool = make_storage(dev_dtype), oracle_pool = make_storage(oracle_dtype);
  std::memset(dev_pool->data(), 0xff, static_cast<size_t>(dev_pool->size_bytes()));  // NaN in f32, bf16 and e4m3
  std::vector<float> scales(2 * static_cast<size_t>(c.kv_heads));  // [K heads..., V heads...], FP8 only
  std::uniform_real_distribution<float> scale_dist(0.01f, 0.03f);
  for (float& s : scales) s = scale_dist(rng);
  std::normal_distribution<float> normal;
  for (int32_t s = 0; s < num_seqs; ++s) {
    for (int32_t p = 0; p < context_lens[static_cast<size_t>(s)]; ++p) {
      const int64_t slot =
          int64_t{block_tables[static_cast<size_t>(s * max_blocks_per_seq + p / bsz)]} * bsz + p % bsz;
      for (int32_t kv = 0; kv < 2; ++kv) {
        for (int32_t h = 0; h < c.kv_heads; ++h) {
          for (int32_t d = 0; d < c.head_dim; ++d) {
            const float x = normal(rng);
            switch (kv_dtype) {
              case KvCacheDType::kF32:
                PutElement(*dev_pool, slot, kv, h, d, x);
                PutElement(*oracle_pool, slot, kv, h, d, x);
                break;
              case KvCacheDType::kBf16:
                PutElement(*dev_pool, slot, kv, h, d, F32ToBf16(x));
                PutElement(*oracle_pool, slot, kv, h, d, F32ToBf16(x));
                break;
              case KvCacheDType::kFp8E4M3: {
                const float scale = scales[static_cast<size_t>(kv * c.kv_heads + h)];
                const uint8_t bits = F32ToFp8E4M3(x / scale);
                PutElement(*dev_pool, slot, kv, h, d, bits);
                PutElement(*oracle_pool, slot, kv, h, d, Fp8E4M3ToF32(bits) * scale);
                break;
              }
            }
          }
        }
      }
    }
  }

  const size_t out_elems =
      static_cast<size_t>(num_tokens) * static_cast<size_t>(c.heads) * static_cast<size_t>(c.head_dim);
  std::vector<float> q(out_elems);
  std::normal_distribution<float> q_dist(0.f, 2.f);  // scores with a spread of about 2
  for (float& x : q) x = q_dist(rng);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));

  PreparedCase out;
  out.args.num_seqs = num_seqs;
  out.args.num_tokens = num_tokens;
  out.args.num_heads = c.heads;
  out.args.num_kv_heads = c.kv_heads;
  out.args.head_dim = c.head_dim;
  out.args.block_size_tokens = bsz;
  out.args.max_blocks_per_seq = max_blocks_per_seq;
  out.args.max_query_len = max_n + c.extra_query_len;
  out.args.scale = scale;
  out.args.kv_dtype = kv_dtype;

  // The CPU backend (the scalar reference where the CPU lacks AVX2).
  std::unique_ptr<backend::Backend> oracle;
  if (auto cpu = backend::CreateCpuBackend({}); cpu.ok()) {
    oracle = std::move(cpu).value();
  } else {
    oracle = backend::CreateReferenceBackend();
  }
  std::vector<float> ref(out_elems);
  const backend::PagedAttentionBatch batch{.query_start = query_start,
                                           .context_lens = context_lens,
                                           .block_tables = block_tables,
                                           .max_blocks_per_seq = max_blocks_per_seq};
  oracle->PagedAttention(TensorView::Contiguous(q.data(), DType::kF32, {num_tokens, c.heads, c.head_dim}),
                         oracle_pool->LayerView(0), batch, scale,
                         TensorView::Contiguous(ref.data(), DType::kF32, {num_tokens, c.heads, c.head_dim}));

  out.query_start = std::move(query_start);
  out.context_lens = std::move(context_lens);
  out.block_tables = std::move(block_tables);
  out.pool = std::move(dev_pool);
  out.q = std::move(q);
  out.k_scale.assign(scales.begin(), scales.begin() + c.kv_heads);
  out.v_scale.assign(scales.begin() + c.kv_heads, scales.end());
  out.ref = std::move(ref);
  return out;
}

// The tolerance of the header comment; NaN or an unwritten (NaN) element never passes.
void ExpectCloseToReference(const std::vector<float>& got, const std::vector<float>& ref, int64_t row_elems) {
  ASSERT_EQ(got.size(), ref.size());
  double max_ref = 0, max_err = 0, err2 = 0, ref2 = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " (token " << static_cast<int64_t>(i) / row_elems
                                       << ") is " << got[i] << ": unwritten or NaN";
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    if (diff > max_err) {
      max_err = diff;
      worst = i;
    }
    err2 += diff * diff;
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  const double rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-30));
  EXPECT_LE(max_err, 2e-2 * std::max(1.0, max_ref))
      << "worst at element " << worst << ": got " << got[worst] << " ref " << ref[worst];
  EXPECT_LE(rel_l2, 1e-2) << "relative L2 error";
  ::testing::Test::RecordProperty("rel_l2", std::to_string(rel_l2));
}

// rows_per_warp 16 goes through LaunchPagedAttentionPrefill (the default), 32 through the variant.
void RunOnGpu(const PrefillCase& c, KvCacheDType kv_dtype, uint32_t seed, int32_t rows_per_warp) {
  PreparedCase p = Prepare(c, kv_dtype, seed);
  DeviceBuffer<std::byte> d_pool(std::vector<std::byte>(p.pool->data(), p.pool->data() + p.pool->size_bytes()));
  DeviceBuffer<float> d_q(p.q), d_out(std::vector<float>(p.ref.size(), std::numeric_limits<float>::quiet_NaN()));
  DeviceBuffer<int32_t> d_query_start(p.query_start), d_context_lens(p.context_lens), d_tables(p.block_tables);
  DeviceBuffer<float> d_k_scale(p.k_scale), d_v_scale(p.v_scale);
  PagedAttentionPrefillArgs args = p.args;
  args.q = d_q.get();
  args.kv_cache = d_pool.get();
  args.query_start = d_query_start.get();
  args.context_lens = d_context_lens.get();
  args.block_tables = d_tables.get();
  args.k_scale = d_k_scale.get();
  args.v_scale = d_v_scale.get();
  args.out = d_out.get();
  static_assert(kPagedAttentionPrefillRowsPerWarp == 16);
  ASSERT_EQ(rows_per_warp == 16 ? LaunchPagedAttentionPrefill(args, nullptr)
                                : LaunchPagedAttentionPrefillWithRowsPerWarp(args, rows_per_warp, nullptr),
            cudaSuccess);
  ExpectCloseToReference(d_out.Download(), p.ref, int64_t{c.heads} * c.head_dim);
}

void RunOnHostEmulation(const PrefillCase& c, KvCacheDType kv_dtype, uint32_t seed, int32_t rows_per_warp) {
  PreparedCase p = Prepare(c, kv_dtype, seed);
  std::vector<float> out(p.ref.size(), std::numeric_limits<float>::quiet_NaN());
  PagedAttentionPrefillArgs args = p.args;
  args.q = p.q.data();
  args.kv_cache = p.pool->data();
  args.query_start = p.query_start.data();
  args.context_lens = p.context_lens.data();
  args.block_tables = p.block_tables.data();
  args.k_scale = p.k_scale.data();
  args.v_scale = p.v_scale.data();
  args.out = out.data();
  ASSERT_EQ(host_emulation::EmulatePagedAttentionPrefill(args, rows_per_warp), cudaSuccess);
  ExpectCloseToReference(out, p.ref, int64_t{c.heads} * c.head_dim);
}

const std::vector<PrefillCase>& Cases() {
  static const std::vector<PrefillCase> cases = {
      // One decode-like token, MHA, head_dim 64.
      {.heads = 8, .kv_heads = 8, .head_dim = 64, .block_size = 16, .seqs = {{0, 1}}},
      // 257 prompt tokens (5 query tiles, the last with one row), GQA 4, head_dim 128.
      {.heads = 8, .kv_heads = 2, .head_dim = 128, .block_size = 16, .seqs = {{0, 257}}},
      // A cached prefix of 100 and a chunk of 37 (neither a multiple of B), GQA 8.
      {.heads = 8, .kv_heads = 1, .head_dim = 128, .block_size = 16, .seqs = {{100, 37}}},
      // Row and context limits in the last 8 keys of a tile (44 + 16 = 60; 12 + 112 = 124 = 64 + 60).
      {.heads = 4, .kv_heads = 2, .head_dim = 128, .block_size = 16, .seqs = {{44, 40}, {12, 113}}},
      // A mixed batch: prefill chunks with and without prefixes, decode rows, B = 32, GQA 4.
      {.heads = 16,
       .kv_heads = 4,
       .head_dim = 64,
       .block_size = 32,
       .seqs = {{0, 70}, {200, 1}, {33, 1}, {5, 130}, {0, 1}, {64, 64}, {1000, 1}},
       .extra_query_len = 100},
      // B = 8, a long prefix with a tiny chunk, and a grid sized past every sequence.
      {.heads = 4,
       .kv_heads = 4,
       .head_dim = 128,
       .block_size = 8,
       .seqs = {{500, 3}, {17, 65}, {0, 129}},
       .extra_query_len = 64},
      // B = 128 (a block wider than a 64-key tile), GQA 8, head_dim 64.
      {.heads = 16, .kv_heads = 2, .head_dim = 64, .block_size = 128, .seqs = {{300, 20}, {0, 190}, {129, 1}}},
  };
  return cases;
}

class PagedAttentionPrefillKernelTest : public ::testing::TestWithParam<KvCacheDType> {};

TEST_P(PagedAttentionPrefillKernelTest, MatchesCpuBackendWithinBf16Tolerance) {
  KVMESH_SKIP_WITHOUT_GPU();
  uint32_t seed = 1234;
  for (const int32_t rows_per_warp : {16, 32}) {
    for (const PrefillCase& c : Cases()) {
      ::testing::Message what;
      what << "rows/warp " << rows_per_warp << " H " << c.heads << " Hkv " << c.kv_heads << " D " << c.head_dim
           << " B " << c.block_size << " seqs";
      for (const SeqShape& s : c.seqs) what << " " << s.prefix << "+" << s.new_tokens;
      SCOPED_TRACE(what);
      RunOnGpu(c, GetParam(), seed++, rows_per_warp);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PoolDTypes, PagedAttentionPrefillKernelTest,
                         ::testing::Values(KvCacheDType::kF32, KvCacheDType::kBf16, KvCacheDType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<KvCacheDType>& info) { return PoolName(info.param); });

// The kernel's own code on the host (host_emulation/): every pool type, head_dim 64 and 128,
// GQA 1/2/4/8, B 8/16/24/32/128, prefixes, decode rows and surplus query tiles, in shapes
// small enough for one std::thread per CUDA thread. Runs with or without a GPU.
TEST(PagedAttentionPrefillKernelEmulationTest, KernelCodeMatchesCpuBackendOnHost) {
  struct EmulatedCase {
    PrefillCase shape;
    KvCacheDType kv_dtype;
  };
  const std::vector<EmulatedCase> cases = {
      {{.heads = 2, .kv_heads = 2, .head_dim = 64, .block_size = 16, .seqs = {{0, 1}}}, KvCacheDType::kBf16},
      {{.heads = 4, .kv_heads = 1, .head_dim = 128, .block_size = 16, .seqs = {{100, 37}}}, KvCacheDType::kFp8E4M3},
      {{.heads = 2, .kv_heads = 1, .head_dim = 128, .block_size = 16, .seqs = {{0, 130}}}, KvCacheDType::kF32},
      {{.heads = 4,
        .kv_heads = 2,
        .head_dim = 64,
        .block_size = 32,
        .seqs = {{0, 70}, {200, 1}, {33, 1}, {5, 80}, {0, 1}, {64, 64}},
        .extra_query_len = 40},
       KvCacheDType::kBf16},
      {{.heads = 1, .kv_heads = 1, .head_dim = 128, .block_size = 8, .seqs = {{150, 3}, {17, 65}}, .extra_query_len = 64},
       KvCacheDType::kFp8E4M3},
      {{.heads = 2, .kv_heads = 1, .head_dim = 64, .block_size = 128, .seqs = {{130, 20}, {129, 1}}}, KvCacheDType::kF32},
      {{.heads = 2, .kv_heads = 1, .head_dim = 128, .block_size = 24, .seqs = {{50, 70}}}, KvCacheDType::kBf16},
      {{.heads = 8, .kv_heads = 1, .head_dim = 64, .block_size = 16, .seqs = {{20, 10}}}, KvCacheDType::kF32},
      // A warp whose first row sits at key 60 of a tile (44 + 16), and one whose only row is
      // the context's last position, key 60 of its tile (12 + 112; 125 keys): the mask must
      // cover the last few keys of a tile, and the NaN past the context.
      {{.heads = 2, .kv_heads = 1, .head_dim = 64, .block_size = 16, .seqs = {{44, 40}, {12, 113}}},
       KvCacheDType::kBf16},
  };
  uint32_t seed = 77;
  for (const int32_t rows_per_warp : {16, 32}) {
    for (const EmulatedCase& e : cases) {
      const PrefillCase& c = e.shape;
      ::testing::Message what;
      what << "rows/warp " << rows_per_warp << " " << PoolName(e.kv_dtype) << " H " << c.heads << " Hkv "
           << c.kv_heads << " D " << c.head_dim << " B " << c.block_size << " seqs";
      for (const SeqShape& s : c.seqs) what << " " << s.prefix << "+" << s.new_tokens;
      SCOPED_TRACE(what);
      RunOnHostEmulation(c, e.kv_dtype, seed++, rows_per_warp);
      if (HasFatalFailure()) return;
    }
  }
}

// Shape checks happen before any CUDA call, so this runs with or without a GPU.
TEST(PagedAttentionPrefillKernelShapeTest, RejectsBadShapesWithInvalidValue) {
  alignas(16) float dummy_f[4] = {};  // aligned as the launcher requires: one flaw per case below
  int32_t dummy_i = 0;
  PagedAttentionPrefillArgs good;
  good.q = dummy_f;
  good.kv_cache = dummy_f;
  good.query_start = &dummy_i;
  good.context_lens = &dummy_i;
  good.block_tables = &dummy_i;
  good.k_scale = dummy_f;
  good.v_scale = dummy_f;
  good.out = dummy_f;
  good.num_seqs = 1;
  good.num_tokens = 1;
  good.num_heads = 8;
  good.num_kv_heads = 2;
  good.head_dim = 128;
  good.block_size_tokens = 16;
  good.max_blocks_per_seq = 4;
  good.max_query_len = 1;
  good.scale = 0.1f;
  auto with = [&](auto edit) {
    PagedAttentionPrefillArgs a = good;
    edit(a);
    return LaunchPagedAttentionPrefill(a, nullptr);
  };
  if (std::string why; !test_util::HaveGpu(&why)) {
    // The flawless args pass the checks and fail only at the first CUDA call (no device), so each
    // case below fails on its one flaw. (With a device they would launch on host pointers.)
    EXPECT_NE(with([](auto&) {}), cudaErrorInvalidValue);
  }
  EXPECT_EQ(LaunchPagedAttentionPrefillWithRowsPerWarp(good, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPagedAttentionPrefillWithRowsPerWarp(good, 64, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.head_dim = 96; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.head_dim = 256; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.num_kv_heads = 3; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.block_size_tokens = 5; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.num_seqs = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.num_tokens = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.max_query_len = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) { a.out = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([&](auto& a) { a.kv_cache = dummy_f + 2; }), cudaErrorInvalidValue);  // 8-byte aligned only
  EXPECT_EQ(with([&](auto& a) { a.q = dummy_f + 2; }), cudaErrorInvalidValue);  // 8-byte aligned only
  EXPECT_EQ(with([&](auto& a) { a.out = dummy_f + 3; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) {
              a.kv_dtype = KvCacheDType::kFp8E4M3;
              a.k_scale = nullptr;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& a) {
              a.num_heads = 65536;
              a.num_kv_heads = 1;
              a.num_seqs = 1 << 14;
              a.max_query_len = 1 << 12;
            }),
            cudaErrorInvalidValue);  // grid of 2^36 blocks
}

}  // namespace
}  // namespace kvmesh::kernels
