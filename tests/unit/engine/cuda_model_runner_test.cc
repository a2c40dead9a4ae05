// The CUDA model runner against the CPU one (PagedModelRunner, itself checked against the
// dense path and transformers): the same batches — prefill chunks over cached prefixes,
// mixed with decode steps, then pure decode steps replayed from CUDA graphs at two batch
// buckets, and a copy-on-write fork — over shuffled block tables must give the same
// logits within bf16 tolerance, on every test model (bf16, f16 and f32 weights, GQA 8,
// llama3 RoPE scaling, Qwen2 biases, tied embeddings).
//
// Tolerance: relative L2 error of each logits row <= 3e-2, and the argmax must agree
// wherever the CPU's top two logits are more than 0.05 * max|logit| apart. Sources of
// difference: attention prefill runs on tensor cores with bf16 operands, bf16/f16
// models' GEMM activations are rounded to the weight type (vLLM does the same), and f32
// reductions run in another order. Replayed graphs must equal eager steps bit for bit.
//
// Where no GPU can be used (CI), the runner must refuse with a clear error instead.
#include "engine/cuda_model_runner.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "engine/llama_model.h"
#include "engine/paged_model_runner.h"
#include "engine/sampler.h"
#include "model_param_name.h"

namespace kvmesh::engine {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 128;

// The test models; KVMESH_TEST_MODELS_DIR overrides the build tree's folder where the
// binary runs elsewhere (tools/gpu-check carries them to the GPU machine).
std::string ModelDir(const std::string& name) {
  const char* dir = std::getenv("KVMESH_TEST_MODELS_DIR");
  return (dir != nullptr && *dir != 0 ? std::string(dir) : std::string(KVMESH_BINARY_DIR) + "/models") + "/" + name;
}

TEST(CudaModelRunnerTest, RefusesClearlyWithoutAGpu) {
  absl::StatusOr<std::unique_ptr<backend::Backend>> backend = backend::CreateCudaBackend(0);
  if (backend.ok()) GTEST_SKIP() << "a GPU is here; the other tests cover it";
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
  EXPECT_NE(backend.status().message().find("CUDA"), std::string::npos) << backend.status();
  // And the runner refuses a model that is not on the CUDA backend.
  auto cpu = backend::CreateCpuBackend({});
  ASSERT_TRUE(cpu.ok());
  auto model = LlamaModel::Load(ModelDir("tiny-llama"), **cpu);
  ASSERT_TRUE(model.ok()) << model.status();
  auto runner = CreateCudaModelRunner(**model, {.num_blocks = 8, .max_model_len = 256});
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition) << runner.status();
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
  int32_t computed = 0;
};

class CudaModelRunnerModelTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto gpu = backend::CreateCudaBackend(0);
    if (!gpu.ok()) GTEST_SKIP() << "no GPU here (" << gpu.status().message() << "); this test runs where one is";
    gpu_backend_ = std::move(gpu).value();
    auto cpu = backend::CreateCpuBackend({});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_backend_ = std::move(cpu).value();
    auto cpu_model = LlamaModel::Load(ModelDir(GetParam()), *cpu_backend_);
    ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();
    cpu_model_ = std::move(cpu_model).value();
    auto gpu_model = LlamaModel::Load(ModelDir(GetParam()), *gpu_backend_);
    ASSERT_TRUE(gpu_model.ok()) << gpu_model.status();
    gpu_model_ = std::move(gpu_model).value();
    // Both pools hold the model's own precision (bf16 for bf16 weights, else f32).
    kv_dtype_ = cpu_model_->weights().embed_tokens.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
    auto cpu_runner = PagedModelRunner::Create(
        *cpu_model_, {.block_size_tokens = kBlockSize, .num_blocks = kNumBlocks, .kv_cache_dtype = kv_dtype_});
    ASSERT_TRUE(cpu_runner.ok()) << cpu_runner.status();
    cpu_runner_ = std::move(cpu_runner).value();
    const int64_t head_dim = gpu_model_->config().head_dim;
    if (head_dim != 64 && head_dim != 128) {
      // The kernels are built for head_dim 64 and 128: any other is refused when the
      // runner is made, naming the field, rather than failing at its first launch.
      auto refused = CreateCudaModelRunner(*gpu_model_, {.num_blocks = kNumBlocks, .max_model_len = 1024});
      ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
      EXPECT_NE(refused.status().message().find("head_dim"), std::string::npos) << refused.status();
      GTEST_SKIP() << "head_dim " << head_dim << " is refused clearly on the GPU: " << refused.status().message();
    }
    gpu_runner_ = MakeGpuRunner(/*graphs=*/true);
    ASSERT_NE(gpu_runner_, nullptr);
    free_blocks_.resize(kNumBlocks);
    std::iota(free_blocks_.begin(), free_blocks_.end(), 0);
    std::shuffle(free_blocks_.begin(), free_blocks_.end(), rng_);
  }

  std::unique_ptr<ModelRunner> MakeGpuRunner(bool graphs) {
    auto runner = CreateCudaModelRunner(*gpu_model_, {.block_size_tokens = kBlockSize,
                                                      .num_blocks = kNumBlocks,
                                                      .kv_cache_dtype = kv_dtype_,
                                                      .max_num_tokens = 512,
                                                      .max_num_seqs = 16,
                                                      .max_model_len = 1024,
                                                      .enable_cuda_graphs = graphs});
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? std::move(runner).value() : nullptr;
  }

  std::vector<int32_t> TakeBlocks(int32_t n) {
    std::vector<int32_t> out(free_blocks_.end() - n, free_blocks_.end());
    free_blocks_.resize(free_blocks_.size() - n);
    return out;
  }

  // Runs `batch` on both runners and checks every logits row (see the file comment).
  void RunAndCompare(const ModelBatch& batch, const char* what) {
    auto want = cpu_runner_->Execute(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = gpu_runner_->Execute(batch);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->logits.size(), want->logits.size()) << what;
    const int64_t v = cpu_runner_->vocab_size();
    for (size_t row = 0; row * v < want->logits.size(); ++row) {
      const float* w = want->logits.data() + row * v;
      const float* g = got->logits.data() + row * v;
      double err = 0, norm = 0;
      float max_abs = 0;
      int32_t want_top = 0, got_top = 0;
      for (int64_t i = 0; i < v; ++i) {
        ASSERT_TRUE(std::isfinite(g[i])) << what << ": row " << row << " logit " << i << " is " << g[i];
        err += (double{g[i]} - w[i]) * (double{g[i]} - w[i]);
        norm += double{w[i]} * w[i];
        max_abs = std::max(max_abs, std::fabs(w[i]));
        if (w[i] > w[want_top]) want_top = static_cast<int32_t>(i);
        if (g[i] > g[got_top]) got_top = static_cast<int32_t>(i);
      }
      const double rel = std::sqrt(err / std::max(norm, 1e-30));
      worst_rel_ = std::max(worst_rel_, rel);
      EXPECT_LE(rel, 3e-2) << what << ": row " << row;
      float second = -INFINITY;
      for (int64_t i = 0; i < v; ++i) {
        if (i != want_top) second = std::max(second, w[i]);
      }
      if (w[want_top] - second > 0.05f * max_abs) {
        EXPECT_EQ(got_top, want_top) << what << ": row " << row << " (CPU margin " << w[want_top] - second << ")";
      }
    }
  }

  std::mt19937 rng_{7};
  std::unique_ptr<backend::Backend> gpu_backend_, cpu_backend_;
  std::unique_ptr<LlamaModel> gpu_model_, cpu_model_;
  DType kv_dtype_ = DType::kF32;
  std::unique_ptr<ModelRunner> cpu_runner_, gpu_runner_;
  std::vector<int32_t> free_blocks_;
  double worst_rel_ = 0;
};

TEST_P(CudaModelRunnerModelTest, MatchesCpuRunnerOnChunkedPrefillDecodeAndForks) {
  const int32_t vocab = cpu_runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  // Prompt lengths straddle blocks; 1 and 257 query tokens included.
  std::vector<Seq> seqs;
  for (int32_t len : {1, 17, 40, 257}) {
    Seq s;
    for (int32_t i = 0; i < len + 12; ++i) s.tokens.push_back(token(rng_));  // 12 more for decode steps
    s.table = TakeBlocks((len + 12 + kBlockSize - 1) / kBlockSize);
    seqs.push_back(std::move(s));
  }
  const std::vector<int32_t> prompt_lens = {1, 17, 40, 257};
  // Step 1: the first 10 tokens of the long prompts (a cached prefix for step 2), whole
  // short prompts.
  auto chunk_of = [&](Seq& s, int32_t n) {
    SequenceChunk c;
    c.token_ids.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
    c.start_position = s.computed;
    c.block_table = s.table;
    c.compute_logits = true;
    s.computed += n;
    return c;
  };
  ModelBatch first;
  first.chunks.push_back(chunk_of(seqs[0], 1));
  first.chunks.push_back(chunk_of(seqs[1], 17));
  first.chunks.push_back(chunk_of(seqs[2], 10));
  first.chunks.push_back(chunk_of(seqs[3], 10));
  RunAndCompare(first, "prefill");
  // Step 2: the rest of the long prompts over their cached prefix, mixed with decode rows.
  ModelBatch second;
  second.chunks.push_back(chunk_of(seqs[0], 1));
  second.chunks.push_back(chunk_of(seqs[1], 1));
  second.chunks.push_back(chunk_of(seqs[2], 30));
  second.chunks.push_back(chunk_of(seqs[3], 247));
  RunAndCompare(second, "prefill over a cached prefix, mixed with decode");
  // Steps 3-8: pure decode, all four (bucket 4: eager + capture, then replays).
  for (int step = 0; step < 6; ++step) {
    ModelBatch decode;
    for (Seq& s : seqs) decode.chunks.push_back(chunk_of(s, 1));
    RunAndCompare(decode, "decode (bucket 4)");
  }
  // Steps 9-11: three sequences (bucket 4, padded) then one (bucket 1).
  for (int step = 0; step < 2; ++step) {
    ModelBatch decode;
    for (size_t i = 1; i < seqs.size(); ++i) decode.chunks.push_back(chunk_of(seqs[i], 1));
    RunAndCompare(decode, "decode (3 of bucket 4)");
  }
  {
    ModelBatch decode;
    decode.chunks.push_back(chunk_of(seqs[3], 1));
    RunAndCompare(decode, "decode (bucket 1)");
  }
  // A fork: sequence 1's partly filled last block (positions 16..25) copied for a child
  // that decodes on in its own copy.
  {
    Seq& parent = seqs[1];
    ASSERT_NE(parent.computed % kBlockSize, 0);
    std::vector<int32_t> child_table = parent.table;
    const int32_t last = parent.computed / kBlockSize;
    child_table[last] = TakeBlocks(1)[0];
    ModelBatch fork;
    fork.block_copies.push_back({parent.table[last], child_table[last]});
    SequenceChunk c;
    c.token_ids = {parent.tokens[parent.computed]};
    c.start_position = parent.computed;
    c.block_table = child_table;
    c.compute_logits = true;
    fork.chunks.push_back(c);
    RunAndCompare(fork, "copy-on-write fork");
  }
  std::printf("%s: worst relative L2 error of a logits row vs the CPU runner: %.3g\n", GetParam().c_str(), worst_rel_);
}

// Both runners keep tables (engine/block_tables.h) and get deltas as the scheduler sends
// them: a whole table on each sequence's first chunk, then the entries from the block of
// the first new token, across decode buckets (graph replays read the gathered tables),
// with a sequence released and resumed on new blocks, a stateless chunk beside them, and
// the device's row array written by scatters only.
TEST_P(CudaModelRunnerModelTest, KeptTablesUpdatedByDeltasMatchCpuRunner) {
  ASSERT_TRUE(gpu_runner_->keeps_block_tables());
  const int32_t vocab = cpu_runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  std::vector<Seq> seqs;
  for (int32_t len : {5, 30, 200}) {
    Seq s;
    for (int32_t i = 0; i < len + 40; ++i) s.tokens.push_back(token(rng_));
    s.table = TakeBlocks((len + 40 + kBlockSize - 1) / kBlockSize);
    seqs.push_back(std::move(s));
  }
  std::vector<int32_t> kept(seqs.size(), 0);
  auto delta_of = [&](size_t i, int32_t n) {
    Seq& s = seqs[i];
    SequenceChunk c;
    c.token_ids.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
    c.start_position = s.computed;
    const int32_t needed = (s.computed + n + kBlockSize - 1) / kBlockSize;
    const int32_t from = std::min(kept[i], s.computed / kBlockSize);
    c.block_table.assign(s.table.begin() + from, s.table.begin() + needed);
    c.seq_id = static_cast<int64_t>(i) + 100;
    c.block_table_start = from;
    c.compute_logits = true;
    kept[i] = needed;
    s.computed += n;
    return c;
  };
  ModelBatch prefill;
  for (size_t i = 0; i < seqs.size(); ++i) {
    prefill.chunks.push_back(delta_of(i, static_cast<int32_t>(seqs[i].tokens.size()) - 40));
  }
  RunAndCompare(prefill, "prefill, whole tables");
  for (int step = 0; step < 20; ++step) {
    ModelBatch decode;
    if (step == 8) {  // sequence 1 is preempted and resumes on new blocks, whole again
      decode.released_seq_ids = {101};
      seqs[1].computed = 0;
      seqs[1].table = TakeBlocks(static_cast<int32_t>(seqs[1].table.size()));
      kept[1] = 0;
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (step % 5 == 4 && i == 0) continue;  // bucket 2 now and then
      const bool resuming = seqs[i].computed == 0;
      decode.chunks.push_back(delta_of(i, resuming ? 31 + step : 1));
    }
    if (step % 7 == 3) {  // a one-off chunk with its whole table and no seq_id
      SequenceChunk c;
      c.token_ids = {token(rng_)};
      c.start_position = 0;
      c.block_table = TakeBlocks(1);
      c.compute_logits = true;
      decode.chunks.push_back(c);
    }
    RunAndCompare(decode, "decode over kept tables");
  }
}

TEST_P(CudaModelRunnerModelTest, GraphReplayEqualsEagerBitForBit) {
  std::unique_ptr<ModelRunner> eager = MakeGpuRunner(/*graphs=*/false);
  ASSERT_NE(eager, nullptr);
  const int32_t vocab = cpu_runner_->vocab_size();
  std::uniform_int_distribution<int32_t> token(0, std::min(vocab, 4000) - 1);
  std::vector<Seq> seqs(3);
  for (Seq& s : seqs) {
    for (int i = 0; i < 40; ++i) s.tokens.push_back(token(rng_));
    s.table = TakeBlocks(3);
  }
  for (int step = 0; step < 21; ++step) {  // 20 prefill tokens, then 20 decode steps
    ModelBatch batch;
    for (Seq& s : seqs) {
      const int32_t n = step == 0 ? 20 : 1;  // a prefill, then decode steps (graphs)
      batch.chunks.push_back({std::vector<int32_t>(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n),
                              s.computed, s.table, true});
      s.computed += n;
    }
    auto a = gpu_runner_->Execute(batch);
    auto b = eager->Execute(batch);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->logits, b->logits) << "step " << step;
  }
}

// argmax_only chunks get the host sampler's greedy token of the logits the same step
// computes (run twice: the same tokens at the same positions rewrite the same KV).
TEST_P(CudaModelRunnerModelTest, ArgmaxOnlyChunksReturnTheGreedyTokenOfTheirLogits) {
  ASSERT_TRUE(gpu_runner_->returns_argmax());
  const int32_t vocab = cpu_runner_->vocab_size();
  ModelBatch prefill;
  prefill.chunks.push_back({{5, 6, 7, 8, 9}, 0, {3}, false});
  prefill.chunks.push_back({{10, 11, 12}, 0, {4}, false});
  ASSERT_TRUE(gpu_runner_->Execute(prefill).ok());
  for (bool graph_bucket_seen : {false, true}) {
    ModelBatch step;
    step.chunks.push_back({{20}, 5, {3}, true});
    step.chunks.push_back({{21}, 3, {4}, true});
    auto logits = gpu_runner_->Execute(step);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->logits.size(), 2u * vocab);
    step.chunks[0].argmax_only = true;  // mixed: one greedy, one with logits
    auto mixed = gpu_runner_->Execute(step);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    ASSERT_EQ(mixed->argmax_token_ids.size(), 1u) << graph_bucket_seen;
    ASSERT_EQ(mixed->logits.size(), 1u * vocab);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    auto sampler = SequenceSampler::Create(greedy, vocab, {}, {});
    ASSERT_TRUE(sampler.ok());
    const std::span<const float> row0(logits->logits.data(), static_cast<size_t>(vocab));
    EXPECT_EQ(mixed->argmax_token_ids[0], sampler->Sample(row0).value().token_id);
    EXPECT_EQ(std::vector<float>(mixed->logits.begin(), mixed->logits.end()),
              std::vector<float>(logits->logits.begin() + vocab, logits->logits.end()));
  }
}

TEST_P(CudaModelRunnerModelTest, RejectsBadBatchesWithoutBreakingTheRunner) {
  ModelBatch bad;
  bad.chunks.push_back({{cpu_runner_->vocab_size()}, 0, {0}, true});  // token outside the vocabulary
  EXPECT_EQ(gpu_runner_->Execute(bad).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBatch too_long;
  too_long.chunks.push_back({std::vector<int32_t>(600, 1), 0, std::vector<int32_t>(38, 0), true});  // > 512 tokens
  EXPECT_EQ(gpu_runner_->Execute(too_long).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBatch good;
  good.chunks.push_back({{1, 2, 3}, 0, {4}, true});
  RunAndCompare(good, "after rejected batches");
}

// The host KV tier's copies (ModelBatch::swap_out / swap_in) through kernels/swap_blocks:
// a block offloaded to a pinned, a managed (--kv-host-memory=uvm) or a pageable slot and
// onboarded into another block holds the same bytes, so decoding over it gives the same
// logits bit for bit as over the original.
TEST_P(CudaModelRunnerModelTest, SwappedBlocksComeBackByteForByte) {
  const int64_t slot_bytes = gpu_runner_->kv_swap_bytes_per_block();
  ASSERT_GT(slot_bytes, 0);
  const std::vector<int32_t> table = TakeBlocks(3);
  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 3);
  ModelBatch prefill;
  prefill.chunks.push_back({prompt, 0, table, true});
  ASSERT_TRUE(gpu_runner_->Execute(prefill).ok());
  ModelBatch decode;
  decode.chunks.push_back({{7}, 40, table, true});
  auto want = gpu_runner_->Execute(decode);
  ASSERT_TRUE(want.ok()) << want.status();

  for (const char* memory : {"pinned", "managed", "pageable"}) {
    std::byte* slot = nullptr;
    std::function<void(std::byte*)> release;
    std::vector<std::byte> pageable;
    if (std::string(memory) == "pageable") {
      pageable.resize(static_cast<size_t>(2 * slot_bytes));
      slot = pageable.data();
    } else {
      auto host = MakeCudaHostTierMemory(0, /*managed=*/std::string(memory) == "managed");
      ASSERT_TRUE(host.ok()) << host.status();
      slot = host->allocate(2 * slot_bytes);
      ASSERT_NE(slot, nullptr) << memory;
      release = host->deallocate;
    }
    // Block table[1] -> slot -> a fresh block -> slot + slot_bytes.
    const int32_t fresh = TakeBlocks(1)[0];
    ModelBatch out;
    out.swap_out.push_back({table[1], slot});
    auto r = gpu_runner_->Execute(out);
    ASSERT_TRUE(r.ok()) << memory << ": " << r.status();
    ModelBatch in;
    in.swap_in.push_back({fresh, slot});
    ASSERT_TRUE(gpu_runner_->Execute(in).ok()) << memory;
    ModelBatch again;
    again.swap_out.push_back({fresh, slot + slot_bytes});
    ASSERT_TRUE(gpu_runner_->Execute(again).ok()) << memory;
    EXPECT_EQ(std::memcmp(slot, slot + slot_bytes, static_cast<size_t>(slot_bytes)), 0) << memory;
    // Decoding over the onboarded copy is decoding over the original.
    std::vector<int32_t> swapped = table;
    swapped[1] = fresh;
    ModelBatch over_copy;
    over_copy.chunks.push_back({{7}, 40, swapped, true});
    auto got = gpu_runner_->Execute(over_copy);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->logits.size(), want->logits.size());
    EXPECT_EQ(std::memcmp(got->logits.data(), want->logits.data(), want->logits.size() * sizeof(float)), 0) << memory;
    if (release) release(slot);
  }
  // A swap naming a block outside the pool is refused, and the runner keeps working.
  std::vector<std::byte> slot(static_cast<size_t>(slot_bytes));
  ModelBatch bad;
  bad.swap_out.push_back({kNumBlocks, slot.data()});
  EXPECT_EQ(gpu_runner_->Execute(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(TestModels, CudaModelRunnerModelTest,
                         testing::Values("tiny-llama", "gqa8-f32", "llama-f16", "llama3-rope-f32", "qwen2-f32",
                                         "tied-f32"),
                         ModelParamName);

}  // namespace
}  // namespace kvmesh::engine
