// PagedModelRunner against the dense single-request path (LlamaModel::Forward),
// which is itself checked against transformers: mixed batches of prefill chunks
// and decode steps over shuffled, shared block tables must give the same logits.
#include "engine/paged_model_runner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/checksum.h"
#include "model_param_name.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlockSize = 16;

class PagedModelRunnerTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto backend = backend::CreateCpuBackend({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
    auto runner = PagedModelRunner::Create(*model_, {.block_size_tokens = kBlockSize, .num_blocks = 256});
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(runner).value();
    free_blocks_.resize(256);
    std::iota(free_blocks_.begin(), free_blocks_.end(), 0);
    std::shuffle(free_blocks_.begin(), free_blocks_.end(), rng_);  // non-contiguous tables
  }

  // Logits of every position of `tokens`, from the dense path.
  std::vector<float> DenseLogits(const std::vector<int32_t>& tokens, DType kv_dtype = DType::kF32) {
    auto cache = model_->NewKvCache(static_cast<int64_t>(tokens.size()), kv_dtype);
    EXPECT_TRUE(cache.ok());
    std::vector<int32_t> rows(tokens.size());
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<float> logits;
    EXPECT_TRUE(model_->Forward(tokens, *cache, rows, &logits).ok());
    return logits;
  }

  std::vector<int32_t> TakeBlocks(int32_t n) {
    std::vector<int32_t> out(free_blocks_.end() - n, free_blocks_.end());
    free_blocks_.resize(free_blocks_.size() - n);
    return out;
  }

  float MaxDiff(const float* a, const float* b, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
  }

  std::mt19937 rng_{42};
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<PagedModelRunner> runner_;
  std::vector<int32_t> free_blocks_;
};

struct Seq {
  std::vector<int32_t> tokens;  // the full sequence this test will run
  std::vector<int32_t> table;
  int32_t computed = 0;
};

TEST_P(PagedModelRunnerTest, MixedChunkedBatchesMatchDensePath) {
  const int32_t vocab = runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  // Lengths straddle block boundaries: 1, 15, 16, 17, 40, 100.
  std::vector<Seq> seqs;
  for (int32_t len : {1, 15, 16, 17, 40, 100}) {
    Seq s;
    for (int32_t i = 0; i < len; ++i) s.tokens.push_back(token(rng_));
    s.table = TakeBlocks((len + kBlockSize - 1) / kBlockSize);
    seqs.push_back(std::move(s));
  }
  const int64_t v = vocab;
  std::vector<std::vector<float>> dense;
  for (const Seq& s : seqs) dense.push_back(DenseLogits(s.tokens));
  // Each step every unfinished sequence advances by a random chunk of 1..13 tokens,
  // so prefill chunks and single-token steps mix in one batch.
  std::uniform_int_distribution<int32_t> chunk_len(1, 13);
  float worst = 0;
  int steps = 0;
  while (true) {
    ModelBatch batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - s.computed;
      if (remaining == 0) continue;
      const int32_t n = std::min(remaining, chunk_len(rng_));
      SequenceChunk chunk;
      chunk.token_ids.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
      chunk.start_position = s.computed;
      chunk.block_table = s.table;
      chunk.compute_logits = true;
      batch.chunks.push_back(std::move(chunk));
      who.push_back(i);
    }
    if (batch.chunks.empty()) break;
    auto out = runner_->Execute(batch);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->logits.size(), who.size() * v);
    for (size_t j = 0; j < who.size(); ++j) {
      Seq& s = seqs[who[j]];
      s.computed += static_cast<int32_t>(batch.chunks[j].token_ids.size());
      const float diff = MaxDiff(out->logits.data() + j * v, dense[who[j]].data() + (s.computed - 1) * v, v);
      worst = std::max(worst, diff);
      ASSERT_LE(diff, 1e-3f) << "sequence " << who[j] << " at position " << s.computed - 1;
    }
    ++steps;
  }
  std::printf("%s: %d mixed steps, max |dlogit| vs dense path = %.3g\n", GetParam().c_str(), steps, worst);
}

// A bf16 KV pool holds K and V rounded to bf16; the dense path keeping its cache at
// that precision is its oracle (the rest of the step is f32 on both).
TEST_P(PagedModelRunnerTest, Bf16KvPoolMatchesDensePathAtBf16KvPrecision) {
  auto bf16_runner = PagedModelRunner::Create(
      *model_, {.block_size_tokens = kBlockSize, .num_blocks = 8, .kv_cache_dtype = DType::kBF16});
  ASSERT_TRUE(bf16_runner.ok()) << bf16_runner.status();
  EXPECT_EQ((*bf16_runner)->kv_storage()->layout().dtype(), DType::kBF16);
  const int32_t vocab = bf16_runner.value()->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = token(rng_);
  const std::vector<float> dense_bf16 = DenseLogits(tokens, DType::kBF16);
  const std::vector<float> dense_f32 = DenseLogits(tokens, DType::kF32);
  const std::vector<int32_t> table = {5, 2, 7};
  const int64_t v = vocab;
  float worst = 0, precision_effect = 0;
  // A 25-token prefill chunk, then one token per step.
  for (int32_t done = 0; done < 40;) {
    const int32_t n = done == 0 ? 25 : 1;
    ModelBatch batch;
    batch.chunks.push_back({std::vector<int32_t>(tokens.begin() + done, tokens.begin() + done + n), done, table, true});
    auto out = (*bf16_runner)->Execute(batch);
    ASSERT_TRUE(out.ok()) << out.status();
    done += n;
    worst = std::max(worst, MaxDiff(out->logits.data(), dense_bf16.data() + (done - 1) * v, v));
    precision_effect = std::max(precision_effect, MaxDiff(out->logits.data(), dense_f32.data() + (done - 1) * v, v));
  }
  // Not ~1e-5 as with f32 KV: the two paths' f32 K/V differ in the last bits (attention
  // order in earlier layers), and rounding to bf16 now and then lands them on
  // neighbouring bf16 values (2^-8 apart). Holding bf16 at all moves logits ~20x more.
  EXPECT_LE(worst, 1e-2f);
  EXPECT_GT(precision_effect, 5 * worst);  // the pool really holds bf16
  std::printf("%s: bf16 KV vs dense at bf16 KV %.3g (vs f32 KV %.3g)\n", GetParam().c_str(), worst, precision_effect);
}

TEST_P(PagedModelRunnerTest, SharedPrefixBlocksGiveTheSameLogits) {
  const int32_t vocab = runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  std::vector<int32_t> prefix(48);  // three full blocks
  for (int32_t& t : prefix) t = token(rng_);
  std::vector<int32_t> a = prefix, b = prefix;
  for (int i = 0; i < 9; ++i) a.push_back(token(rng_));
  for (int i = 0; i < 21; ++i) b.push_back(token(rng_));
  std::vector<int32_t> table_a = TakeBlocks(4);
  // b reuses a's three prefix blocks and has its own tail.
  std::vector<int32_t> table_b(table_a.begin(), table_a.begin() + 3);
  for (int32_t blk : TakeBlocks(2)) table_b.push_back(blk);
  ModelBatch first;
  first.chunks.push_back({a, 0, table_a, true});
  ASSERT_TRUE(runner_->Execute(first).ok());
  ModelBatch second;  // only b's suffix is computed: its prefix KV comes from a's blocks
  second.chunks.push_back({std::vector<int32_t>(b.begin() + 48, b.end()), 48, table_b, true});
  auto out = runner_->Execute(second);
  ASSERT_TRUE(out.ok());
  const std::vector<float> dense = DenseLogits(b);
  EXPECT_LE(MaxDiff(out->logits.data(), dense.data() + (b.size() - 1) * vocab, vocab), 1e-3f);
}

TEST_P(PagedModelRunnerTest, CopyOnWriteCopiesEveryLayerBeforeTheStep) {
  const int32_t vocab = runner_->vocab_size();
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11};  // one partly filled block
  std::vector<int32_t> table = TakeBlocks(1);
  ModelBatch prefill;
  prefill.chunks.push_back({tokens, 0, table, false});
  ASSERT_TRUE(runner_->Execute(prefill).ok());
  // A forked child continues in a copy of the block.
  std::vector<int32_t> child_table = TakeBlocks(1);
  ModelBatch step;
  step.block_copies.push_back({table[0], child_table[0]});
  step.chunks.push_back({{12}, 7, child_table, true});
  auto out = runner_->Execute(step);
  ASSERT_TRUE(out.ok());
  tokens.push_back(12);
  const std::vector<float> dense = DenseLogits(tokens);
  EXPECT_LE(MaxDiff(out->logits.data(), dense.data() + 7 * vocab, vocab), 1e-3f);
}

// A step's offloads come back with the checksum of every host range they wrote, which
// the host tier records instead of rereading the slot; onboarding them restores the
// step's logits bit for bit.
TEST_P(PagedModelRunnerTest, SwapOutReturnsEachHostRangesChecksumAndSwapInRestoresTheBlock) {
  std::vector<int32_t> tokens(kBlockSize + 3);
  std::iota(tokens.begin(), tokens.end(), 3);
  const std::vector<int32_t> table = TakeBlocks(2);
  ModelBatch prefill;
  prefill.chunks.push_back({tokens, 0, table, true});
  auto first = runner_->Execute(prefill);
  ASSERT_TRUE(first.ok()) << first.status();
  const size_t slot_bytes = static_cast<size_t>(runner_->kv_swap_bytes_per_block());
  std::vector<std::byte> host(2 * slot_bytes + 64);
  std::byte* slot = host.data() + (64 - reinterpret_cast<uintptr_t>(host.data()) % 64) % 64;
  ModelBatch out;
  out.swap_out.push_back({table[0], slot});
  out.swap_out.push_back({table[1], slot + slot_bytes});
  auto swapped = runner_->Execute(out);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  ASSERT_EQ(swapped->swap_out_checksums.size(), 2u);
  EXPECT_EQ(swapped->swap_out_checksums[0], kv::Checksum({slot, slot_bytes}));
  EXPECT_EQ(swapped->swap_out_checksums[1], kv::Checksum({slot + slot_bytes, slot_bytes}));
  // Back into two other blocks: the last token's logits over them equal the first run's.
  const std::vector<int32_t> moved = TakeBlocks(2);
  ModelBatch in;
  in.swap_in.push_back({moved[0], slot});
  in.swap_in.push_back({moved[1], slot + slot_bytes});
  std::vector<int32_t> last(tokens.end() - 1, tokens.end());
  in.chunks.push_back({last, static_cast<int32_t>(tokens.size()) - 1, moved, true});
  auto again = runner_->Execute(in);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->swap_out_checksums.empty());
  EXPECT_EQ(again->logits, first->logits);
}

// The same steps twice over the same blocks: once with every table whole, once as the
// scheduler sends them to a runner that keeps tables (seq_ids, deltas from the block of
// each chunk's first token, releases, a table rewritten on resume): the logits are
// bit-identical, since both runs read the same tables.
TEST_P(PagedModelRunnerTest, KeptTablesUpdatedByDeltasGiveTheLogitsOfWholeTables) {
  ASSERT_TRUE(runner_->keeps_block_tables());
  const int32_t vocab = runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  std::vector<Seq> seqs;
  for (int32_t len : {3, 17, 40, 70}) {
    Seq s;
    for (int32_t i = 0; i < len; ++i) s.tokens.push_back(token(rng_));
    s.table = TakeBlocks((len + kBlockSize - 1) / kBlockSize);
    seqs.push_back(std::move(s));
  }
  // The plan: per step, each unfinished sequence's chunk length; sequence 3 is "preempted"
  // at step 3 and resumes from position 0 on new blocks.
  const std::vector<int32_t> resumed_table = TakeBlocks(5);
  const auto run = [&](bool deltas) {
    std::vector<Seq> state = seqs;
    std::vector<int32_t> kept(state.size(), 0);
    std::mt19937 plan(7);
    std::vector<float> all_logits;
    for (int32_t step = 0;; ++step) {
      ModelBatch batch;
      if (step == 3) {
        state[3].computed = 0;
        state[3].table = resumed_table;
        if (deltas && kept[3] > 0) batch.released_seq_ids.push_back(3);
        kept[3] = 0;
      }
      std::vector<size_t> who;  // chunk order changes from step to step
      for (size_t i = 0; i < state.size(); ++i) {
        if (state[i].computed < static_cast<int32_t>(state[i].tokens.size())) who.push_back(i);
      }
      std::shuffle(who.begin(), who.end(), plan);
      for (const size_t i : who) {
        Seq& s = state[i];
        const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - s.computed;
        const int32_t n = std::min(remaining, std::uniform_int_distribution<int32_t>(1, 9)(plan));
        SequenceChunk chunk;
        chunk.token_ids.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
        chunk.start_position = s.computed;
        const int32_t needed = (s.computed + n + kBlockSize - 1) / kBlockSize;
        const int32_t from = deltas ? std::min(kept[i], s.computed / kBlockSize) : 0;
        chunk.block_table.assign(s.table.begin() + from, s.table.begin() + needed);  // grows as it goes
        if (deltas) {
          chunk.seq_id = static_cast<int64_t>(i);
          chunk.block_table_start = from;
          kept[i] = needed;
        }
        chunk.compute_logits = true;
        batch.chunks.push_back(std::move(chunk));
        s.computed += n;
      }
      if (batch.chunks.empty()) break;
      auto out = runner_->Execute(batch);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) break;
      for (size_t j = 0; j < who.size(); ++j) {
        all_logits.insert(all_logits.end(), out->logits.begin() + static_cast<std::ptrdiff_t>(j * vocab),
                          out->logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab));
      }
    }
    return all_logits;
  };
  const std::vector<float> whole = run(false);
  const std::vector<float> incremental = run(true);
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(whole, incremental);
}

TEST_P(PagedModelRunnerTest, RejectsMalformedBatches) {
  ModelBatch short_table;
  short_table.chunks.push_back({std::vector<int32_t>(20, 1), 0, {0}, true});  // 20 tokens need 2 blocks
  EXPECT_EQ(runner_->Execute(short_table).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBatch bad_block;
  bad_block.chunks.push_back({{1}, 0, {9999}, true});
  EXPECT_EQ(runner_->Execute(bad_block).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBatch bad_token;
  bad_token.chunks.push_back({{runner_->vocab_size()}, 0, {0}, true});
  EXPECT_EQ(runner_->Execute(bad_token).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, PagedModelRunnerTest, testing::Values("llama-f32", "tiny-llama"),
                         ModelParamName);

}  // namespace
}  // namespace kvmesh::engine
