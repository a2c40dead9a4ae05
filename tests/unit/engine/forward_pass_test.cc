// ForwardPass on its own, outside any runner: one sequence's step over a paged pool
// against the dense oracle (LlamaModel::Forward), the per-layer hook's order and what
// the pool holds when it runs, the greedy tokens it can return beside the logits, and a
// step larger than was reserved. The runners' own tests (paged_model_runner_test,
// tensor_parallel_runner_test, the engine equivalence tests) cover batches and ranks.
#include "engine/forward_pass.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/kv_layout.h"
#include "model_param_name.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlockSize = 16;

class ForwardPassTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto backend = backend::CreateCpuBackend({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    auto model = LlamaModel::Load(std::string(KVMESH_BINARY_DIR) + "/models/" + GetParam(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
    const model::ModelConfig& c = model_->config();
    auto storage = kv::KvStorage::Create({.num_layers = static_cast<int32_t>(c.num_hidden_layers),
                                          .num_kv_heads = static_cast<int32_t>(c.num_key_value_heads),
                                          .head_dim = static_cast<int32_t>(c.head_dim),
                                          .block_size_tokens = kBlockSize,
                                          .dtype = DType::kF32,
                                          .num_blocks = 8});
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = std::move(storage).value();
    std::memset(storage_->data(), 0, static_cast<size_t>(storage_->size_bytes()));
  }

  // One sequence of `tokens` as one prefill chunk from position 0, in blocks 5, 2, 7, ...
  // (not in order), every position through the LM head.
  void BuildStep(const std::vector<int32_t>& tokens) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    token_ids_ = tokens;
    positions_.resize(n);
    std::iota(positions_.begin(), positions_.end(), 0);
    const std::vector<int32_t> blocks = {5, 2, 7, 0};
    slots_.resize(n);
    for (int32_t p = 0; p < n; ++p) slots_[p] = int64_t{blocks[p / kBlockSize]} * kBlockSize + p % kBlockSize;
    query_start_ = {0, n};
    context_lens_ = {n};
    block_table_ = blocks;
    logit_rows_.resize(n);
    std::iota(logit_rows_.begin(), logit_rows_.end(), 0);
    logits_.assign(static_cast<size_t>(n) * model_->config().vocab_size, 0.0f);
  }

  ForwardStep Step() {
    const int64_t n = static_cast<int64_t>(token_ids_.size());
    return {.num_tokens = n,
            .token_ids = token_ids_,
            .positions = positions_,
            .slots = slots_,
            .attention = {.query_start = query_start_,
                          .context_lens = context_lens_,
                          .block_tables = block_table_,
                          .max_blocks_per_seq = static_cast<int32_t>(block_table_.size()),
                          .max_query_len = static_cast<int32_t>(n),
                          .max_context_len = static_cast<int32_t>(n)},
            .logit_rows = logit_rows_,
            .logits = TensorView::Contiguous(logits_.data(), DType::kF32, {n, model_->config().vocab_size}),
            .kv_cache = [this](int32_t layer) { return storage_->LayerView(layer); }};
  }

  std::vector<float> DenseLogits(const std::vector<int32_t>& tokens) {
    auto cache = model_->NewKvCache(static_cast<int64_t>(tokens.size()));
    EXPECT_TRUE(cache.ok());
    std::vector<int32_t> rows(tokens.size());
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<float> logits;
    EXPECT_TRUE(model_->Forward(tokens, *cache, rows, &logits).ok());
    return logits;
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<kv::KvStorage> storage_;
  std::vector<int32_t> token_ids_, positions_, query_start_, context_lens_, block_table_, logit_rows_;
  std::vector<int64_t> slots_;
  std::vector<float> logits_;
};

std::vector<int32_t> Tokens(int32_t n) {
  std::vector<int32_t> tokens(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = (i * 37 + 11) % 200;
  return tokens;
}

TEST_P(ForwardPassTest, OneSequenceGivesTheDenseOraclesLogits) {
  const std::vector<int32_t> tokens = Tokens(40);  // three blocks, the last one partial
  BuildStep(tokens);
  ForwardPass pass(*model_, ForwardWeights::FromModel(*model_), /*comm=*/nullptr);
  ASSERT_TRUE(pass.Reserve(40, 40).ok());
  ASSERT_TRUE(pass.Run(Step()).ok());
  ASSERT_TRUE(backend_->TakeError().ok());
  const std::vector<float> dense = DenseLogits(tokens);
  ASSERT_EQ(dense.size(), logits_.size());
  float worst = 0;
  for (size_t i = 0; i < dense.size(); ++i) worst = std::max(worst, std::fabs(dense[i] - logits_[i]));
  EXPECT_LE(worst, 1e-3f);
}

TEST_P(ForwardPassTest, EachLayersHookRunsOnceItsKvIsWrittenAndBeforeTheNextLayersIs) {
  const std::vector<int32_t> tokens = Tokens(20);
  BuildStep(tokens);
  const kv::KvLayout& layout = storage_->layout();
  // Whether any byte of `layer`'s block 5 (the sequence's first) is written.
  auto written = [&](int32_t layer) {
    const std::byte* block = storage_->data() + layout.BlockOffset(layer, kv::BlockId{5});
    return std::any_of(block, block + layout.BlockBytes(), [](std::byte b) { return b != std::byte{0}; });
  };
  std::vector<int32_t> seen;
  ForwardStep step = Step();
  step.after_kv_write = [&](int32_t layer) {
    EXPECT_TRUE(written(layer)) << "layer " << layer;
    if (layer + 1 < layout.num_layers()) {
      EXPECT_FALSE(written(layer + 1)) << "layer " << layer + 1;
    }
    seen.push_back(layer);
  };
  ForwardPass pass(*model_, ForwardWeights::FromModel(*model_), nullptr);
  ASSERT_TRUE(pass.Reserve(20, 20).ok());
  ASSERT_TRUE(pass.Run(step).ok());
  std::vector<int32_t> expected(static_cast<size_t>(layout.num_layers()));
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
}

TEST_P(ForwardPassTest, GreedyTokensAreEachLogitRowsArgmax) {
  const std::vector<int32_t> tokens = Tokens(18);
  BuildStep(tokens);
  logit_rows_ = {17, 3, 9};  // any rows, in any order
  const int64_t vocab = model_->config().vocab_size;
  logits_.assign(3 * vocab, 0.0f);
  std::vector<int32_t> greedy(3, -7);
  ForwardStep step = Step();
  step.logits = TensorView::Contiguous(logits_.data(), DType::kF32, {3, vocab});
  step.argmax = greedy;
  ForwardPass pass(*model_, ForwardWeights::FromModel(*model_), nullptr);
  ASSERT_TRUE(pass.Reserve(18, 3).ok());
  ASSERT_TRUE(pass.Run(step).ok());
  const std::vector<float> dense = DenseLogits(tokens);
  for (int i = 0; i < 3; ++i) {
    const float* row = logits_.data() + i * vocab;
    EXPECT_EQ(greedy[i], std::max_element(row, row + vocab) - row) << "row " << i;
    // The rows are the asked-for positions' (a gather, not the first three).
    const float* want = dense.data() + int64_t{logit_rows_[i]} * vocab;
    float worst = 0;
    for (int64_t j = 0; j < vocab; ++j) worst = std::max(worst, std::fabs(row[j] - want[j]));
    EXPECT_LE(worst, 1e-3f) << "row " << i;
  }
}

TEST_P(ForwardPassTest, AStepLargerThanReservedIsRefusedBeforeAnyOpRuns) {
  BuildStep(Tokens(20));
  ForwardPass pass(*model_, ForwardWeights::FromModel(*model_), nullptr);
  ASSERT_TRUE(pass.Reserve(19, 20).ok());
  int hooks = 0;
  ForwardStep step = Step();
  step.after_kv_write = [&](int32_t) { ++hooks; };
  EXPECT_EQ(pass.Run(step).code(), absl::StatusCode::kInternal);
  ForwardPass few_rows(*model_, ForwardWeights::FromModel(*model_), nullptr);
  ASSERT_TRUE(few_rows.Reserve(20, 19).ok());
  EXPECT_EQ(few_rows.Run(step).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(hooks, 0);
  // Reserving more later is enough: nothing was left half-run.
  ASSERT_TRUE(pass.Reserve(20, 20).ok());
  EXPECT_TRUE(pass.Run(step).ok());
  EXPECT_EQ(hooks, model_->config().num_hidden_layers);
}

INSTANTIATE_TEST_SUITE_P(Models, ForwardPassTest, testing::Values("llama-f32", "tiny-llama"),
                         ModelParamName);

}  // namespace
}  // namespace kvmesh::engine
