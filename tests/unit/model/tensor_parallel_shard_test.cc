#include "model/tensor_parallel_shard.h"

#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::model {
namespace {

ModelConfig Config(int64_t heads, int64_t kv_heads) {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 2;
  return c;
}

TEST(TensorParallelShardTest, SplitsHeadsMlpAndVocabEvenly) {
  const ModelConfig c = Config(8, 4);
  const TensorParallelShard s = ComputeTensorParallelShard(c, 1, 2).value();
  EXPECT_EQ(s.num_heads, 4);
  EXPECT_EQ(s.head_begin, 4);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.kv_head_begin, 2);
  EXPECT_EQ(s.kv_head_replication, 1);
  EXPECT_EQ(s.intermediate_size, 8);
  EXPECT_EQ(s.intermediate_begin, 8);
  EXPECT_EQ(s.vocab_size, 32);
  EXPECT_EQ(s.vocab_begin, 32);
}

TEST(TensorParallelShardTest, MoreRanksThanKvHeadsReplicatesTheHeadTheQueriesRead) {
  const ModelConfig c = Config(8, 2);  // query heads 0-3 read KV head 0, 4-7 read KV head 1
  for (int32_t r = 0; r < 4; ++r) {
    const TensorParallelShard s = ComputeTensorParallelShard(c, r, 4).value();
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.kv_head_replication, 2);
    EXPECT_EQ(s.kv_head_begin, s.head_begin / 4) << "rank " << r;
  }
  const TensorParallelShard mqa = ComputeTensorParallelShard(Config(8, 1), 3, 4).value();
  EXPECT_EQ(mqa.kv_head_begin, 0);
  EXPECT_EQ(mqa.kv_head_replication, 4);
}

TEST(TensorParallelShardTest, UnsplittableShapesAreInvalidArgumentNamingTheDimension) {
  auto error = [](const ModelConfig& c, int32_t n) { return ComputeTensorParallelShard(c, 0, n).status(); };
  EXPECT_NE(error(Config(6, 6), 4).message().find("num_attention_heads (6)"), std::string::npos);
  EXPECT_NE(error(Config(12, 3), 2).message().find("num_key_value_heads (3)"), std::string::npos);
  ModelConfig c = Config(8, 8);
  c.vocab_size = 65;
  const absl::Status vocab = error(c, 2);
  EXPECT_EQ(vocab.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(vocab.message().find("vocab_size (65)"), std::string::npos) << vocab;
  c = Config(8, 8);
  c.intermediate_size = 18;
  EXPECT_NE(error(c, 4).message().find("intermediate_size (18)"), std::string::npos);
  EXPECT_EQ(error(Config(8, 8), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTensorParallelShard(Config(8, 8), 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorParallelShardTest, WeightsAreViewsIntoTheFullTensors) {
  const ModelConfig c = Config(4, 2);
  // [rows, cols] f32 matrices filled with row * 1000 + col.
  auto matrix = [](std::vector<float>& buf, int64_t rows, int64_t cols) {
    buf.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) buf[r * cols + k] = static_cast<float>(r * 1000 + k);
    return TensorView::Contiguous(buf.data(), DType::kF32, {rows, cols});
  };
  std::vector<float> embed, q, kv, o, gate, down, norm(8, 1.0f);
  ModelWeights full;
  full.embed_tokens = matrix(embed, 64, 8);
  full.lm_head = full.embed_tokens;
  full.norm = TensorView::Contiguous(norm.data(), DType::kF32, {8});
  LayerWeights l;
  l.q_proj = matrix(q, 8, 8);
  l.k_proj = l.v_proj = matrix(kv, 4, 8);
  l.o_proj = matrix(o, 8, 8);
  l.gate_proj = l.up_proj = matrix(gate, 16, 8);
  l.down_proj = matrix(down, 8, 16);
  l.input_layernorm = l.post_attention_layernorm = full.norm;
  full.layers = {l};
  const TensorParallelShard s = ComputeTensorParallelShard(c, 1, 2).value();
  const ModelWeights w = ShardModelWeights(full, c, s);
  const LayerWeights& r1 = w.layers[0];
  EXPECT_EQ(w.embed_tokens.dim(0), 32);
  EXPECT_EQ(w.embed_tokens.data_as<float>()[0], 32000.0f);  // row 32
  EXPECT_EQ(r1.q_proj.dim(0), 4);
  EXPECT_EQ(r1.q_proj.data_as<float>()[0], 4000.0f);  // heads 2-3: rows 4-7
  EXPECT_EQ(r1.k_proj.data_as<float>()[0], 2000.0f);  // KV head 1: rows 2-3
  // Row-parallel: columns 4-7 of o_proj, rows keep the full stride.
  EXPECT_EQ(r1.o_proj.dim(1), 4);
  EXPECT_EQ(r1.o_proj.strides[0], 8);
  EXPECT_EQ(r1.o_proj.data_as<float>()[0], 4.0f);
  EXPECT_EQ(r1.down_proj.dim(1), 8);
  EXPECT_EQ(r1.down_proj.data_as<float>()[0], 8.0f);
  EXPECT_EQ(r1.gate_proj.data_as<float>()[0], 8000.0f);
  // Views, not copies.
  EXPECT_EQ(r1.q_proj.data_as<float>(), q.data() + 4 * 8);
}

}  // namespace
}  // namespace kvmesh::model
