// WriteKvCache and PagedAttention: the CPU backends (both ISAs, one and several
// threads) against the reference oracle and against DenseAttention on each
// sequence's context gathered into a dense cache; bitwise batch invariance (a
// sequence alone vs in a batch, a prompt in one chunk vs several chunks with
// WriteKvCache in between); WriteKvCache exactness.
//
// Tolerance: V is in [-1, 1], so every output is a convex combination of values
// of magnitude <= 1; f32 scores (one FMA chain over D) and an f32 online softmax
// against the f64 oracle stay within 2e-6 absolute (observed max ~3e-7).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "gtest/gtest.h"

namespace kvmesh::backend {
namespace {

constexpr float kTolerance = 2e-6f;

// An owning f32 buffer and a contiguous view of it.
struct Tensor {
  std::vector<float> values;
  TensorView view;

  explicit Tensor(std::initializer_list<int64_t> shape) {
    view = TensorView::Contiguous(nullptr, DType::kF32, shape);
    values.assign(static_cast<size_t>(view.num_elements()), 0.0f);
    view.data = values.data();
  }
  Tensor(const Tensor&) = delete;
  float* data() { return values.data(); }
  int64_t size() const { return static_cast<int64_t>(values.size()); }
  void Fill(std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (float& x : values) x = dist(rng);
  }
};

// Every CPU backend this host can run: both ISAs, one and several threads.
std::vector<std::unique_ptr<Backend>> CpuBackends() {
  std::vector<std::unique_ptr<Backend>> out;
  for (const char* isa : {"avx512", "avx2"}) {
    for (int threads : {1, 0, 5}) {
      auto backend = CreateCpuBackend({.num_threads = threads, .isa = isa});
      if (backend.ok()) {
        out.push_back(std::move(backend).value());
      } else {
        EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
      }
    }
  }
  EXPECT_FALSE(out.empty());
  return out;
}

std::string Describe(const Backend& b, int threads_hint) {
  return std::string(b.name()) + "#" + std::to_string(threads_hint);
}

struct SeqSpec {
  int32_t context_len;
  int32_t num_queries;  // the last num_queries positions of the context
  int share_with = -1;  // shares its leading full blocks with this earlier sequence
};

// Block tables over a shuffled pool; sequences with share_with reuse the other's
// leading full blocks (prefix sharing). Unused table entries are -1.
struct Batch {
  std::vector<int32_t> query_start;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> block_tables;
  int32_t max_blocks_per_seq = 0;
  int64_t num_blocks = 0;

  PagedAttentionBatch view() const { return {query_start, context_lens, block_tables, max_blocks_per_seq}; }
  int64_t num_tokens() const { return query_start.back(); }
  const int32_t* table(size_t s) const { return block_tables.data() + s * max_blocks_per_seq; }
};

Batch MakeBatch(const std::vector<SeqSpec>& specs, int64_t block_size, std::mt19937& rng) {
  Batch b;
  int64_t needed = 3;  // a few blocks nobody uses
  for (const SeqSpec& s : specs) {
    const int32_t blocks = static_cast<int32_t>((s.context_len + block_size - 1) / block_size);
    b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, blocks);
    needed += blocks;
  }
  std::vector<int32_t> pool(static_cast<size_t>(needed));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  b.num_blocks = needed;
  b.block_tables.assign(specs.size() * b.max_blocks_per_seq, -1);
  b.query_start.push_back(0);
  size_t next = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    const SeqSpec& spec = specs[s];
    const int32_t blocks = static_cast<int32_t>((spec.context_len + block_size - 1) / block_size);
    int32_t shared = 0;
    if (spec.share_with >= 0) {
      const SeqSpec& other = specs[spec.share_with];
      shared = static_cast<int32_t>(std::min(spec.context_len, other.context_len) / block_size);
      for (int32_t i = 0; i < shared; ++i) {
        b.block_tables[s * b.max_blocks_per_seq + i] = b.block_tables[spec.share_with * b.max_blocks_per_seq + i];
      }
    }
    for (int32_t i = shared; i < blocks; ++i) b.block_tables[s * b.max_blocks_per_seq + i] = pool[next++];
    b.context_lens.push_back(spec.context_len);
    b.query_start.push_back(b.query_start.back() + spec.num_queries);
  }
  return b;
}

// The K (kv == 0) or V (kv == 1) vector of `head` at position p of sequence s, into
// out[0..d) (K is stored dimension-major within its block, V token-major).
void CacheVector(const Tensor& cache, const Batch& b, size_t s, int64_t p, int kv, int64_t head, float* out) {
  const int64_t hkv = cache.view.shape[2];
  const int64_t bs = cache.view.shape[3];
  const int64_t d = cache.view.shape[4];
  const int64_t block = b.table(s)[p / bs];
  const float* head_base = cache.values.data() + ((block * 2 + kv) * hkv + head) * bs * d;
  for (int64_t c = 0; c < d; ++c) out[c] = kv == 0 ? head_base[c * bs + p % bs] : head_base[(p % bs) * d + c];
}

float MaxAbsDiff(const float* a, const float* b, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

struct Config {
  int64_t h;
  int64_t hkv;
  int64_t d;
  int64_t block_size;
  std::string name() const {
    return "H=" + std::to_string(h) + " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) +
           " B=" + std::to_string(block_size);
  }
};

// Runs `specs` on the reference and every CPU backend; checks reference paged ==
// reference dense bitwise, and cpu paged against both within kTolerance; also cpu
// paged vs cpu DenseAttention.
void CheckAgainstOracles(const Config& c, const std::vector<SeqSpec>& specs, std::mt19937& rng, float* worst) {
  auto ref = CreateReferenceBackend();
  const Batch batch = MakeBatch(specs, c.block_size, rng);
  const int64_t t = batch.num_tokens();
  Tensor q({t, c.h, c.d});
  q.Fill(rng, -2.0f, 2.0f);
  Tensor cache({batch.num_blocks, 2, c.hkv, c.block_size, c.d});
  cache.Fill(rng, -1.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

  Tensor want({t, c.h, c.d});
  ref->PagedAttention(q.view, cache.view, batch.view(), scale, want.view);

  // Dense oracle per sequence on its gathered context.
  Tensor dense_want({t, c.h, c.d});
  std::vector<std::vector<float>> gathered_k(specs.size());
  std::vector<std::vector<float>> gathered_v(specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    const int64_t ctx = specs[s].context_len;
    const int64_t n = specs[s].num_queries;
    auto& kd = gathered_k[s];
    auto& vd = gathered_v[s];
    kd.resize(static_cast<size_t>(ctx * c.hkv * c.d));
    vd.resize(kd.size());
    for (int64_t p = 0; p < ctx; ++p) {
      for (int64_t hh = 0; hh < c.hkv; ++hh) {
        CacheVector(cache, batch, s, p, 0, hh, &kd[(p * c.hkv + hh) * c.d]);
        CacheVector(cache, batch, s, p, 1, hh, &vd[(p * c.hkv + hh) * c.d]);
      }
    }
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(ctx - n + i);
    const int64_t row0 = batch.query_start[s];
    ref->DenseAttention(TensorView::Contiguous(q.data() + row0 * c.h * c.d, DType::kF32, {n, c.h, c.d}),
                        TensorView::Contiguous(kd.data(), DType::kF32, {ctx, c.hkv, c.d}),
                        TensorView::Contiguous(vd.data(), DType::kF32, {ctx, c.hkv, c.d}), positions, scale,
                        TensorView::Contiguous(dense_want.data() + row0 * c.h * c.d, DType::kF32, {n, c.h, c.d}));
  }
  ASSERT_EQ(std::memcmp(want.data(), dense_want.data(), want.size() * 4), 0)
      << "reference paged != reference dense, " << c.name();

  int index = 0;
  for (auto& backend : CpuBackends()) {
    const std::string what = Describe(*backend, index++) + " " + c.name();
    Tensor got({t, c.h, c.d});
    std::fill(got.values.begin(), got.values.end(), NAN);
    backend->PagedAttention(q.view, cache.view, batch.view(), scale, got.view);
    const float diff = MaxAbsDiff(got.data(), want.data(), t * c.h * c.d);
    *worst = std::max(*worst, diff);
    EXPECT_LE(diff, kTolerance) << what;  // NaN fails too

    // The same backend's DenseAttention on the gathered contexts.
    Tensor dense_got({t, c.h, c.d});
    for (size_t s = 0; s < specs.size(); ++s) {
      const int64_t ctx = specs[s].context_len;
      const int64_t n = specs[s].num_queries;
      std::vector<int32_t> positions(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(ctx - n + i);
      const int64_t row0 = batch.query_start[s];
      backend->DenseAttention(
          TensorView::Contiguous(q.data() + row0 * c.h * c.d, DType::kF32, {n, c.h, c.d}),
          TensorView::Contiguous(gathered_k[s].data(), DType::kF32, {ctx, c.hkv, c.d}),
          TensorView::Contiguous(gathered_v[s].data(), DType::kF32, {ctx, c.hkv, c.d}), positions, scale,
          TensorView::Contiguous(dense_got.data() + row0 * c.h * c.d, DType::kF32, {n, c.h, c.d}));
    }
    EXPECT_LE(MaxAbsDiff(got.data(), dense_got.data(), t * c.h * c.d), 2 * kTolerance) << what << " vs dense";
  }
}

TEST(PagedAttentionTest, ReferenceMatchesHandComputedValues) {
  auto ref = CreateReferenceBackend();
  // B = 2, one KV head, D = 2; the sequence's block table is {1}: positions 0 and 1
  // are block 1, offsets 0 and 1. K = (1, 0) at both (stored dimension-major);
  // V = (2, 4) and (6, 8).
  Tensor cache({2, 2, 1, 2, 2});
  float* c = cache.data();
  c[(1 * 2 + 0) * 4 + 0] = 1;  // K dim 0, pos 0 (K is [D][B])
  c[(1 * 2 + 0) * 4 + 1] = 1;  // K dim 0, pos 1
  c[(1 * 2 + 1) * 4 + 0] = 2;  // V pos 0
  c[(1 * 2 + 1) * 4 + 1] = 4;
  c[(1 * 2 + 1) * 4 + 2] = 6;  // V pos 1
  c[(1 * 2 + 1) * 4 + 3] = 8;
  float q[] = {1, 1, 1, 1};  // two query rows (positions 0 and 1), H = 1
  float out[4];
  const std::vector<int32_t> query_start = {0, 2};
  const std::vector<int32_t> context_lens = {2};
  const std::vector<int32_t> tables = {1};
  ref->PagedAttention(TensorView::Contiguous(q, DType::kF32, {2, 1, 2}), cache.view,
                      {query_start, context_lens, tables, 1}, 1.0f, TensorView::Contiguous(out, DType::kF32, {2, 1, 2}));
  EXPECT_NEAR(out[0], 2, 1e-6);  // position 0 sees only itself
  EXPECT_NEAR(out[1], 4, 1e-6);
  EXPECT_NEAR(out[2], 4, 1e-6);  // equal keys: the mean of the values
  EXPECT_NEAR(out[3], 6, 1e-6);
}

// Decodes of awkward lengths, two prefill chunks (one with a cached prefix), prefix
// sharing, shuffled block tables; GQA ratios 1/4/8, D 64/128, B 1/8/16/32.
TEST(PagedAttentionTest, MixedBatchMatchesReferenceAndDenseAttention) {
  std::mt19937 rng(2024);
  float worst = 0.0f;
  const std::vector<SeqSpec> specs = {
      {100, 1}, {1, 1}, {45, 20, 0}, {17, 1}, {33, 33}, {100, 1, 0}, {67, 1, 2},
  };
  for (int64_t d : {64, 128}) {
    for (auto [h, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {16, 2}}) {
      for (int64_t bs : {1, 8, 16, 32}) {
        CheckAgainstOracles({h, hkv, d, bs}, specs, rng, &worst);
      }
    }
  }
  std::printf("max |cpu - reference| = %.3g\n", worst);
}

// Long chunks: 257 query rows behind a cached prefix, and a fresh 257-token prompt
// beside single decodes; odd block sizes too.
TEST(PagedAttentionTest, LongPrefillChunksMatchReference) {
  std::mt19937 rng(77);
  float worst = 0.0f;
  CheckAgainstOracles({8, 2, 128, 16}, {{287, 257}, {300, 1}, {1, 1}}, rng, &worst);
  CheckAgainstOracles({8, 1, 64, 8}, {{257, 257}, {40, 1}}, rng, &worst);
  CheckAgainstOracles({6, 2, 80, 5}, {{90, 57}, {40, 1}, {33, 3}}, rng, &worst);
  CheckAgainstOracles({4, 2, 64, 48}, {{130, 100}, {49, 1}}, rng, &worst);
  std::printf("max |cpu - reference| = %.3g\n", worst);
}

// Contexts past one softmax partition (512 positions): decode rows that the CPU
// kernel splits across threads (split-K) and a prefill chunk crossing partitions,
// against the f64 oracle.
TEST(PagedAttentionTest, LongContextsAcrossPartitionsMatchReference) {
  std::mt19937 rng(4242);
  float worst = 0.0f;
  CheckAgainstOracles({9, 3, 64, 16}, {{2100, 1}, {513, 1}, {1100, 600}, {1024, 1, 0}}, rng, &worst);
  CheckAgainstOracles({8, 2, 64, 48}, {{1601, 1}}, rng, &worst);
  CheckAgainstOracles({4, 4, 128, 1}, {{1030, 1}, {40, 1}}, rng, &worst);
  std::printf("max |cpu - reference| = %.3g\n", worst);
}

// Split-K keeps batch invariance: a long decode row is bitwise the same computed
// whole (alone, one thread) or in pieces on 2, 4 or 7 threads beside other
// sequences, and equals the same position's row of a prefill chunk (which is never
// split) -- the partition boundaries are fixed by position, not by the split.
TEST(PagedAttentionTest, SplitKDecodeIsBitwiseIndependentOfThreadsAndBatch) {
  std::mt19937 rng(31);
  for (const Config& c : {Config{9, 3, 64, 16}, Config{8, 2, 128, 8}, Config{4, 4, 64, 32}}) {
    const int64_t len = 1400;  // the prompt; row p of its chunk is position p
    const int64_t row = c.h * c.d;
    const std::vector<int64_t> positions = {0, 511, 512, 513, 1023, 1024, 1399};
    // The prompt's blocks; the decode rows below read the same table (so the same K/V).
    const Batch batch = MakeBatch({{static_cast<int32_t>(len), static_cast<int32_t>(len)}}, c.block_size, rng);
    Tensor cache({batch.num_blocks, 2, c.hkv, c.block_size, c.d});
    cache.Fill(rng, -1.0f, 1.0f);
    Tensor prompt_q({len, c.h, c.d});
    prompt_q.Fill(rng, -2.0f, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    for (const char* isa : {"avx512", "avx2"}) {
      auto one_or = CreateCpuBackend({.num_threads = 1, .isa = isa});
      if (!one_or.ok()) continue;
      auto& one = *one_or;
      // (a) The prompt alone, one chunk, one thread.
      Tensor prefill_out({len, c.h, c.d});
      {
        const std::vector<int32_t> qs = {0, static_cast<int32_t>(len)};
        const std::vector<int32_t> ctx = {static_cast<int32_t>(len)};
        const std::vector<int32_t> table(batch.table(0), batch.table(0) + batch.max_blocks_per_seq);
        one->PagedAttention(prompt_q.view, cache.view, {qs, ctx, table, batch.max_blocks_per_seq}, scale,
                            prefill_out.view);
      }
      // The decode rows' queries: the prompt's rows at those positions.
      const int64_t n = static_cast<int64_t>(positions.size());
      Tensor decode_q({n, c.h, c.d});
      for (int64_t i = 0; i < n; ++i) std::memcpy(decode_q.data() + i * row, prompt_q.data() + positions[i] * row, row * 4);
      for (int threads : {1, 2, 4, 7}) {
        auto backend = CreateCpuBackend({.num_threads = threads, .isa = isa}).value();
        // (b) All decode rows in one batch (no prefill: split-K when threads > 1).
        Batch decodes;
        decodes.max_blocks_per_seq = batch.max_blocks_per_seq;
        decodes.query_start.push_back(0);
        for (int64_t i = 0; i < n; ++i) {
          decodes.query_start.push_back(static_cast<int32_t>(i + 1));
          decodes.context_lens.push_back(static_cast<int32_t>(positions[i] + 1));
          decodes.block_tables.insert(decodes.block_tables.end(), batch.table(0),
                                      batch.table(0) + batch.max_blocks_per_seq);
        }
        Tensor out({n, c.h, c.d});
        backend->PagedAttention(decode_q.view, cache.view, decodes.view(), scale, out.view);
        // (c) Each decode row alone.
        for (int64_t i = 0; i < n; ++i) {
          const std::vector<int32_t> qs = {0, 1};
          const std::vector<int32_t> ctx = {decodes.context_lens[i]};
          const std::vector<int32_t> table(decodes.table(i), decodes.table(i) + decodes.max_blocks_per_seq);
          Tensor alone({1, c.h, c.d});
          backend->PagedAttention(TensorView::Contiguous(decode_q.data() + i * row, DType::kF32, {1, c.h, c.d}),
                                  cache.view, {qs, ctx, table, decodes.max_blocks_per_seq}, scale, alone.view);
          EXPECT_EQ(std::memcmp(alone.data(), out.data() + i * row, row * 4), 0)
              << isa << " " << c.name() << " threads " << threads << " position " << positions[i] << " alone vs batch";
          EXPECT_EQ(std::memcmp(prefill_out.data() + positions[i] * row, out.data() + i * row, row * 4), 0)
              << isa << " " << c.name() << " threads " << threads << " position " << positions[i]
              << " decode vs prefill row";
        }
      }
    }
  }
}

// A sequence's rows are bitwise the same alone (one thread) as inside a batch
// (many threads), at any row index.
TEST(PagedAttentionTest, SequenceAloneEqualsSequenceInBatchBitwise) {
  std::mt19937 rng(99);
  for (const Config& c : {Config{8, 2, 64, 16}, Config{16, 2, 128, 8}, Config{4, 4, 64, 1}}) {
    const std::vector<SeqSpec> specs = {{100, 1}, {300, 70}, {45, 20, 1}, {17, 1}, {33, 33}, {250, 1, 1}};
    const Batch batch = MakeBatch(specs, c.block_size, rng);
    const int64_t t = batch.num_tokens();
    const int64_t row = c.h * c.d;
    Tensor q({t, c.h, c.d});
    q.Fill(rng, -2.0f, 2.0f);
    Tensor cache({batch.num_blocks, 2, c.hkv, c.block_size, c.d});
    cache.Fill(rng, -1.0f, 1.0f);
    const float scale = 0.125f;
    for (const char* isa : {"avx512", "avx2"}) {
      auto many = CreateCpuBackend({.num_threads = 0, .isa = isa});
      if (!many.ok()) continue;
      auto one = CreateCpuBackend({.num_threads = 1, .isa = isa}).value();
      Tensor full({t, c.h, c.d});
      (*many)->PagedAttention(q.view, cache.view, batch.view(), scale, full.view);
      // Reversed batch order: every sequence at a different row index.
      Batch reversed;
      reversed.max_blocks_per_seq = batch.max_blocks_per_seq;
      reversed.num_blocks = batch.num_blocks;
      reversed.query_start.push_back(0);
      Tensor q_rev({t, c.h, c.d});
      for (size_t k = specs.size(); k-- > 0;) {
        const int64_t n = specs[k].num_queries;
        std::memcpy(q_rev.data() + reversed.query_start.back() * row, q.data() + batch.query_start[k] * row,
                    n * row * 4);
        reversed.query_start.push_back(reversed.query_start.back() + static_cast<int32_t>(n));
        reversed.context_lens.push_back(batch.context_lens[k]);
        reversed.block_tables.insert(reversed.block_tables.end(), batch.table(k),
                                     batch.table(k) + batch.max_blocks_per_seq);
      }
      Tensor rev_out({t, c.h, c.d});
      one->PagedAttention(q_rev.view, cache.view, reversed.view(), scale, rev_out.view);
      for (size_t s = 0; s < specs.size(); ++s) {
        const int64_t n = specs[s].num_queries;
        const int64_t row0 = batch.query_start[s];
        Tensor alone({n, c.h, c.d});
        const std::vector<int32_t> qs = {0, static_cast<int32_t>(n)};
        const std::vector<int32_t> ctx = {batch.context_lens[s]};
        const std::vector<int32_t> table(batch.table(s), batch.table(s) + batch.max_blocks_per_seq);
        one->PagedAttention(TensorView::Contiguous(q.data() + row0 * row, DType::kF32, {n, c.h, c.d}), cache.view,
                            {qs, ctx, table, batch.max_blocks_per_seq}, scale, alone.view);
        EXPECT_EQ(std::memcmp(alone.data(), full.data() + row0 * row, n * row * 4), 0)
            << isa << " " << c.name() << " sequence " << s << " alone vs batch";
        const int64_t rev_row0 = reversed.query_start[specs.size() - 1 - s];
        EXPECT_EQ(std::memcmp(rev_out.data() + rev_row0 * row, full.data() + row0 * row, n * row * 4), 0)
            << isa << " " << c.name() << " sequence " << s << " reversed batch";
      }
    }
  }
}

// A prompt computed as one chunk, or as several chunks (and decode steps) with
// WriteKvCache in between, beside another sequence, in other physical blocks,
// with another thread count: every token's output is bitwise the same.
TEST(PagedAttentionTest, ChunkedPromptEqualsSingleChunkBitwise) {
  std::mt19937 rng(5);
  const int64_t len = 150;
  const std::vector<int64_t> chunks = {37, 1, 64, 40, 1, 1, 6};
  for (const Config& c : {Config{8, 2, 64, 16}, Config{16, 2, 128, 8}, Config{4, 4, 64, 32}, Config{8, 1, 128, 1}}) {
    const int64_t row = c.h * c.d;
    const int64_t kv_row = c.hkv * c.d;
    Tensor q({len, c.h, c.d});
    q.Fill(rng, -2.0f, 2.0f);
    Tensor k({len, c.hkv, c.d});
    k.Fill(rng, -2.0f, 2.0f);
    Tensor v({len, c.hkv, c.d});
    v.Fill(rng, -1.0f, 1.0f);
    // An unrelated decode sequence that rides along with every chunk.
    const int64_t other_ctx = 70;
    Tensor other_q({1, c.h, c.d});
    other_q.Fill(rng, -2.0f, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    for (const char* isa : {"avx512", "avx2"}) {
      auto many = CreateCpuBackend({.num_threads = 0, .isa = isa});
      if (!many.ok()) continue;
      auto one = CreateCpuBackend({.num_threads = 1, .isa = isa}).value();

      // (a) One chunk, one thread.
      Batch whole = MakeBatch({{static_cast<int32_t>(len), static_cast<int32_t>(len)}}, c.block_size, rng);
      Tensor cache_a({whole.num_blocks, 2, c.hkv, c.block_size, c.d});
      std::vector<int64_t> slots(static_cast<size_t>(len));
      for (int64_t p = 0; p < len; ++p) slots[p] = whole.table(0)[p / c.block_size] * c.block_size + p % c.block_size;
      one->WriteKvCache(k.view, v.view, slots, cache_a.view);
      Tensor out_a({len, c.h, c.d});
      one->PagedAttention(q.view, cache_a.view, whole.view(), scale, out_a.view);

      // (b) Chunks, many threads, the other sequence first in the batch, other blocks.
      Batch both = MakeBatch({{static_cast<int32_t>(other_ctx), 1}, {static_cast<int32_t>(len), 1}}, c.block_size,
                             rng);
      Tensor cache_b({both.num_blocks, 2, c.hkv, c.block_size, c.d});
      cache_b.Fill(rng, -1.0f, 1.0f);  // the other sequence's KV; the prompt's slots are overwritten below
      Tensor out_b({len, c.h, c.d});
      int64_t done = 0;
      for (int64_t n : chunks) {
        const int64_t end = done + n;
        const int64_t m = end - done;
        std::vector<int64_t> chunk_slots(static_cast<size_t>(m));
        for (int64_t p = done; p < end; ++p) {
          chunk_slots[p - done] = both.table(1)[p / c.block_size] * c.block_size + p % c.block_size;
        }
        (*many)->WriteKvCache(TensorView::Contiguous(k.data() + done * kv_row, DType::kF32, {m, c.hkv, c.d}),
                              TensorView::Contiguous(v.data() + done * kv_row, DType::kF32, {m, c.hkv, c.d}),
                              chunk_slots, cache_b.view);
        Tensor step_q({1 + m, c.h, c.d});
        std::memcpy(step_q.data(), other_q.data(), row * 4);
        std::memcpy(step_q.data() + row, q.data() + done * row, m * row * 4);
        Batch step = both;
        step.query_start = {0, 1, static_cast<int32_t>(1 + m)};
        step.context_lens = {static_cast<int32_t>(other_ctx), static_cast<int32_t>(end)};
        Tensor step_out({1 + m, c.h, c.d});
        (*many)->PagedAttention(step_q.view, cache_b.view, step.view(), scale, step_out.view);
        std::memcpy(out_b.data() + done * row, step_out.data() + row, m * row * 4);
        done = end;
      }
      ASSERT_EQ(done, len);
      for (int64_t p = 0; p < len; ++p) {
        ASSERT_EQ(std::memcmp(out_a.data() + p * row, out_b.data() + p * row, row * 4), 0)
            << isa << " " << c.name() << " token " << p;
      }
    }
  }
}

// WriteKvCache moves bits: every backend (small and parallel sizes) writes exactly
// where the layout says and nothing else.
TEST(PagedAttentionTest, WriteKvCacheIsExact) {
  std::mt19937 rng(11);
  auto ref = CreateReferenceBackend();
  for (auto [hkv, d, bs] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 64, 16}, {3, 80, 5}, {8, 128, 1}}) {
    for (int64_t t : {1, 7, 600}) {
      const int64_t num_blocks = (t + bs - 1) / bs + 5;
      std::vector<int64_t> all(static_cast<size_t>(num_blocks * bs));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<int64_t> slots(all.begin(), all.begin() + t);
      Tensor k({t, hkv, d});
      k.Fill(rng, -1.0f, 1.0f);
      Tensor v({t, hkv, d});
      v.Fill(rng, -1.0f, 1.0f);
      Tensor want({num_blocks, 2, hkv, bs, d});
      want.Fill(rng, -5.0f, 5.0f);
      // Hand-placed expectation.
      Tensor expected({num_blocks, 2, hkv, bs, d});
      expected.values = want.values;
      expected.view.data = expected.values.data();
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t h = 0; h < hkv; ++h) {
          for (int64_t c = 0; c < d; ++c) {
            const int64_t block = slots[i] / bs;
            const int64_t off = slots[i] % bs;
            expected.values[((block * 2 + 0) * hkv + h) * bs * d + c * bs + off] = k.values[(i * hkv + h) * d + c];
            expected.values[(((block * 2 + 1) * hkv + h) * bs + off) * d + c] = v.values[(i * hkv + h) * d + c];
          }
        }
      }
      const std::vector<float> before = want.values;
      ref->WriteKvCache(k.view, v.view, slots, want.view);
      EXPECT_EQ(want.values, expected.values) << "reference T=" << t << " D=" << d;
      int index = 0;
      for (auto& backend : CpuBackends()) {
        Tensor got({num_blocks, 2, hkv, bs, d});
        got.values = before;
        got.view.data = got.values.data();
        backend->WriteKvCache(k.view, v.view, slots, got.view);
        EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * 4), 0)
            << Describe(*backend, index) << " T=" << t << " Hkv=" << hkv << " D=" << d << " B=" << bs;
        ++index;
      }
    }
  }
}

// A bf16 cache is read as its exact f32 widening: every backend gives the same bits
// on a bf16 cache as on an f32 cache holding the same (bf16-representable) values,
// for every block size (direct and gathered K paths) and GQA shape.
TEST(PagedAttentionTest, Bf16CacheEqualsF32CacheOfTheSameValuesBitwise) {
  std::mt19937 rng(5);
  const std::vector<SeqSpec> specs = {{100, 1}, {1, 1}, {45, 20, 0}, {33, 33}, {67, 1, 2}};
  for (auto [h, hkv, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{8, 2, 64}, {4, 4, 128}}) {
    for (int64_t bs : {1, 5, 16, 32}) {
      const Batch batch = MakeBatch(specs, bs, rng);
      const int64_t t = batch.num_tokens();
      Tensor q({t, h, d});
      q.Fill(rng, -2.0f, 2.0f);
      Tensor cache({batch.num_blocks, 2, hkv, bs, d});
      cache.Fill(rng, -1.0f, 1.0f);
      std::vector<uint16_t> bf16(cache.values.size());
      for (size_t i = 0; i < bf16.size(); ++i) {
        bf16[i] = F32ToBf16(cache.values[i]);
        cache.values[i] = Bf16ToF32(bf16[i]);
      }
      TensorView bf16_view = cache.view;
      bf16_view.data = bf16.data();
      bf16_view.dtype = DType::kBF16;
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      std::vector<std::unique_ptr<Backend>> backends = CpuBackends();
      backends.push_back(CreateReferenceBackend());
      int index = 0;
      for (auto& backend : backends) {
        Tensor from_f32({t, h, d});
        Tensor from_bf16({t, h, d});
        backend->PagedAttention(q.view, cache.view, batch.view(), scale, from_f32.view);
        backend->PagedAttention(q.view, bf16_view, batch.view(), scale, from_bf16.view);
        EXPECT_EQ(std::memcmp(from_f32.data(), from_bf16.data(), from_f32.size() * 4), 0)
            << Describe(*backend, index) << " H=" << h << " Hkv=" << hkv << " D=" << d << " B=" << bs;
        ++index;
      }
    }
  }
}

// WriteKvCache into a bf16 cache stores each value rounded to nearest even, where the
// f32 cache would hold it.
TEST(PagedAttentionTest, WriteKvCacheBf16RoundsToNearestEvenInPlace) {
  std::mt19937 rng(12);
  for (auto [hkv, d, bs] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 64, 16}, {3, 80, 5}}) {
    for (int64_t t : {1, 600}) {
      const int64_t num_blocks = (t + bs - 1) / bs + 3;
      std::vector<int64_t> all(static_cast<size_t>(num_blocks * bs));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<int64_t> slots(all.begin(), all.begin() + t);
      Tensor k({t, hkv, d});
      k.Fill(rng, -1.0f, 1.0f);
      Tensor v({t, hkv, d});
      v.Fill(rng, -1.0f, 1.0f);
      std::vector<std::unique_ptr<Backend>> backends = CpuBackends();
      backends.push_back(CreateReferenceBackend());
      int index = 0;
      for (auto& backend : backends) {
        Tensor f32({num_blocks, 2, hkv, bs, d});
        backend->WriteKvCache(k.view, v.view, slots, f32.view);
        std::vector<uint16_t> bf16(f32.values.size(), 0);
        TensorView bf16_view = f32.view;
        bf16_view.data = bf16.data();
        bf16_view.dtype = DType::kBF16;
        backend->WriteKvCache(k.view, v.view, slots, bf16_view);
        std::vector<uint16_t> expected(f32.values.size());
        for (size_t i = 0; i < expected.size(); ++i) expected[i] = F32ToBf16(f32.values[i]);
        EXPECT_EQ(bf16, expected) << Describe(*backend, index) << " T=" << t << " Hkv=" << hkv << " B=" << bs;
        ++index;
      }
    }
  }
}

}  // namespace
}  // namespace kvmesh::backend
