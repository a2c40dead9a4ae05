// The GGUF parser and the GGUF model loader: a valid file built here parses to
// the right metadata, config and (un-permuted) weights; corrupt and truncated
// files, each built here, are refused with an error naming what is wrong.
#include "model/gguf_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"

namespace kvmesh::model {
namespace {

// Little-endian encoders for GGUF pieces.
template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
void PutStr(std::string* s, const std::string& v) {
  Put<uint64_t>(s, v.size());
  s->append(v);
}

enum VT : uint32_t { kU8 = 0, kI32 = 5, kU32 = 4, kF32 = 6, kBool = 7, kStr = 8, kArr = 9, kU64 = 10 };

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: innermost first
  uint32_t type = 0;           // F32
  std::vector<uint8_t> data;
  std::optional<uint64_t> offset;  // default: packed, aligned
};

// Builds a GGUF file; every field can be overridden to corrupt it.
struct Builder {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> kv_count, tensor_count;
  uint64_t alignment = 32;
  std::vector<std::string> kvs;  // encoded key + type + value
  std::vector<Tensor> tensors;

  void Kv(const std::string& key, uint32_t type, const std::string& value) {
    std::string s;
    PutStr(&s, key);
    Put<uint32_t>(&s, type);
    s += value;
    kvs.push_back(s);
  }
  void U32(const std::string& key, uint32_t v) {
    std::string s;
    Put(&s, v);
    Kv(key, kU32, s);
  }
  void F32(const std::string& key, float v) {
    std::string s;
    Put(&s, v);
    Kv(key, kF32, s);
  }
  void Str(const std::string& key, const std::string& v) {
    std::string s;
    PutStr(&s, v);
    Kv(key, kStr, s);
  }
  void Bool(const std::string& key, bool v) { Kv(key, kBool, std::string(1, v ? 1 : 0)); }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    std::string s;
    Put<uint32_t>(&s, kStr);
    Put<uint64_t>(&s, v.size());
    for (const auto& x : v) PutStr(&s, x);
    Kv(key, kArr, s);
  }
  void I32Array(const std::string& key, const std::vector<int32_t>& v) {
    std::string s;
    Put<uint32_t>(&s, kI32);
    Put<uint64_t>(&s, v.size());
    for (int32_t x : v) Put(&s, x);
    Kv(key, kArr, s);
  }
  void AddF32(const std::string& name, std::vector<uint64_t> dims, const std::function<float(int64_t)>& value) {
    Tensor t{name, dims, 0, {}, std::nullopt};
    int64_t n = 1;
    for (uint64_t d : dims) n *= static_cast<int64_t>(d);
    t.data.resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float f = value(i);
      std::memcpy(&t.data[i * 4], &f, 4);
    }
    tensors.push_back(t);
  }

  std::string Build() const {
    std::string s;
    Put(&s, magic);
    Put(&s, version);
    Put<uint64_t>(&s, tensor_count.value_or(tensors.size()));
    Put<uint64_t>(&s, kv_count.value_or(kvs.size()));
    for (const auto& kv : kvs) s += kv;
    uint64_t next = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors) {
      PutStr(&s, t.name);
      Put<uint32_t>(&s, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) Put(&s, d);
      Put(&s, t.type);
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      Put(&s, off);
      next = (off + t.data.size() + alignment - 1) / alignment * alignment;
    }
    if (tensors.empty()) return s;
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t data_start = s.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t at = data_start + offsets[i];
      if (s.size() < at + tensors[i].data.size()) s.resize(at + tensors[i].data.size(), '\0');
      std::memcpy(&s[at], tensors[i].data.data(), tensors[i].data.size());
    }
    return s;
  }
};

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& bytes) {
  return GgufFile::FromBytes({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "test.gguf");
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A tiny llama: hidden 32, 4 heads of 8 (2 KV heads), one layer, FFN 48, vocab 8.
constexpr int64_t kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kFfn = 48, kVocab = 8;

Builder TinyLlama() {
  Builder b;
  b.Str("general.architecture", "llama");
  b.Str("general.name", "tiny");
  b.U32("llama.context_length", 256);
  b.U32("llama.embedding_length", kHidden);
  b.U32("llama.block_count", 1);
  b.U32("llama.feed_forward_length", kFfn);
  b.U32("llama.attention.head_count", kHeads);
  b.U32("llama.attention.head_count_kv", kKvHeads);
  b.F32("llama.rope.freq_base", 100000.0f);
  b.F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.Str("tokenizer.ggml.model", "gpt2");
  b.Str("tokenizer.ggml.pre", "smollm");
  b.StrArray("tokenizer.ggml.tokens", {"<|endoftext|>", "a", "b", "c", "ab", "Ġ", "Ġa", "1"});
  b.I32Array("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 1, 1, 1});
  b.StrArray("tokenizer.ggml.merges", {"a b", "Ġ a"});
  b.U32("tokenizer.ggml.bos_token_id", 0);
  b.U32("tokenizer.ggml.eos_token_id", 0);
  b.Bool("tokenizer.ggml.add_bos_token", false);
  b.Str("tokenizer.chat_template", "{{ messages }}");
  // Each element is its row index (rows are dims[1]) so the permutation is visible.
  auto by_row = [](uint64_t cols) { return [cols](int64_t i) { return static_cast<float>(i / static_cast<int64_t>(cols)); }; };
  b.AddF32("token_embd.weight", {kHidden, kVocab}, by_row(kHidden));
  b.AddF32("blk.0.attn_norm.weight", {kHidden}, [](int64_t) { return 1.0f; });
  b.AddF32("blk.0.attn_q.weight", {kHidden, kHeads * kHeadDim}, by_row(kHidden));
  b.AddF32("blk.0.attn_k.weight", {kHidden, kKvHeads * kHeadDim}, by_row(kHidden));
  b.AddF32("blk.0.attn_v.weight", {kHidden, kKvHeads * kHeadDim}, by_row(kHidden));
  b.AddF32("blk.0.attn_output.weight", {kHeads * kHeadDim, kHidden}, by_row(kHeads * kHeadDim));
  b.AddF32("blk.0.ffn_norm.weight", {kHidden}, [](int64_t) { return 1.0f; });
  b.AddF32("blk.0.ffn_gate.weight", {kHidden, kFfn}, by_row(kHidden));
  b.AddF32("blk.0.ffn_up.weight", {kHidden, kFfn}, by_row(kHidden));
  b.AddF32("blk.0.ffn_down.weight", {kFfn, kHidden}, by_row(kFfn));
  b.AddF32("output_norm.weight", {kHidden}, [](int64_t) { return 1.0f; });
  return b;
}

TEST(GgufFileTest, ParsesAValidFile) {
  const std::string bytes = TinyLlama().Build();
  auto file = Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ((*file)->alignment(), 32u);
  EXPECT_EQ(*(*file)->GetString("general.architecture").value(), "llama");
  EXPECT_EQ(*(*file)->GetInt("llama.block_count").value(), 1);
  EXPECT_EQ((*file)->GetStringArray("tokenizer.ggml.tokens").value()->size(), 8u);
  const GgufTensorInfo* q = (*file)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->Shape(), (std::vector<int64_t>{kHeads * kHeadDim, kHidden}));
  EXPECT_EQ(q->num_bytes, kHeads * kHeadDim * kHidden * 4);
  // Mistyped getters name the key and both types.
  const auto bad = (*file)->GetInt("general.name");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'general.name' must be an integer, got string"), std::string::npos);
}

TEST(GgufModelTest, LoadsConfigAndUnpermutesQK) {
  const std::string path = WriteTemp("tiny.gguf", TinyLlama().Build());
  auto model = LoadGgufModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config;
  EXPECT_EQ(c.hidden_size, kHidden);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.num_attention_heads, kHeads);
  EXPECT_EQ(c.num_key_value_heads, kKvHeads);
  EXPECT_EQ(c.head_dim, kHeadDim);
  EXPECT_EQ(c.intermediate_size, kFfn);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{0});
  const ModelWeights& w = (*model)->weights;
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.layers[0].q_proj.dtype, DType::kBF16);
  // HF row h*D + t*D/2 + i comes from GGUF row h*D + 2i + t.
  auto row_value = [](const TensorView& v, int64_t row) {
    return Bf16ToF32(v.data_as<uint16_t>()[row * v.dim(1)]);
  };
  for (const auto& [view, heads] : {std::pair{w.layers[0].q_proj, kHeads}, std::pair{w.layers[0].k_proj, kKvHeads}}) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < 2; ++t) {
        for (int64_t i = 0; i < kHeadDim / 2; ++i) {
          EXPECT_EQ(row_value(view, h * kHeadDim + t * kHeadDim / 2 + i), h * kHeadDim + 2 * i + t);
        }
      }
    }
  }
  // V is not permuted.
  for (int64_t r = 0; r < kKvHeads * kHeadDim; ++r) EXPECT_EQ(row_value(w.layers[0].v_proj, r), r);
  EXPECT_EQ(LoadModelConfig(path).value().hidden_size, kHidden);  // the --model hook
}

TEST(GgufModelTest, TokenizerAndChatTemplateFromMetadata) {
  const std::string path = WriteTemp("tiny-tok.gguf", TinyLlama().Build());
  auto tok = Tokenizer::FromDirectory(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("ab a", false), (std::vector<int32_t>{4, 6}));
  EXPECT_EQ((*tok)->Encode("<|endoftext|>a11", false), (std::vector<int32_t>{0, 1, 7, 7}));
  EXPECT_TRUE((*tok)->IsSpecial(0));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{4, 6}, false), "ab a");
  EXPECT_EQ((*tok)->bos_token_id(), 0);
  auto tmpl = GgufChatTemplate(path);
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->value(), "{{ messages }}");
}

struct CorruptCase {
  std::string name;
  std::function<std::string()> bytes;
  absl::StatusCode code;
  std::vector<std::string> says;  // substrings the message must contain
  bool load_model = false;        // refused by LoadGgufModel (the file parses)
};

std::string Cut(const std::string& s, size_t n) { return s.substr(0, n); }

std::vector<CorruptCase> CorruptCases() {
  using C = absl::StatusCode;
  const auto loss = C::kDataLoss;
  std::vector<CorruptCase> cases;
  auto add = [&](std::string name, std::function<std::string()> bytes, C code, std::vector<std::string> says,
                 bool model = false) { cases.push_back({std::move(name), std::move(bytes), code, std::move(says), model}); };
  const std::string valid = TinyLlama().Build();
  add("empty file", [] { return std::string(); }, loss, {"not a GGUF file", "no magic"});
  add("three bytes", [] { return std::string("GGU"); }, loss, {"no magic"});
  add("wrong magic", [] { Builder b = TinyLlama(); b.magic = 0x4c4d4747; return b.Build(); }, loss, {"magic is 0x4c4d4747"});
  add("version 1", [] { Builder b = TinyLlama(); b.version = 1; return b.Build(); }, C::kInvalidArgument, {"GGUF version 1"});
  add("version 4", [] { Builder b = TinyLlama(); b.version = 4; return b.Build(); }, C::kInvalidArgument, {"GGUF version 4"});
  add("cut in the header", [valid] { return Cut(valid, 12); }, loss, {"truncated", "tensor count"});
  add("huge key/value count", [] { Builder b = TinyLlama(); b.kv_count = 1ull << 60; return b.Build(); }, loss, {"key/value count"});
  add("huge tensor count", [] { Builder b = TinyLlama(); b.tensor_count = 1ull << 40; return b.Build(); }, loss, {"tensor count"});
  add("key length past the end", [] {
    Builder b;
    std::string kv;
    Put<uint64_t>(&kv, 1000);
    kv += "general";
    b.kvs.push_back(kv);
    return b.Build();
  }, loss, {"metadata key #0", "string length 1000"});
  add("unknown value type", [] { Builder b = TinyLlama(); b.Kv("x.weird", 13, ""); return b.Build(); }, loss, {"'x.weird'", "unknown value type 13"});
  add("cut inside a string value", [] { Builder b; b.Str("general.architecture", "llama"); return Cut(b.Build(), 66); }, loss, {"general.architecture"});
  add("array length past the end", [] {
    Builder b;
    std::string v;
    Put<uint32_t>(&v, kStr);
    Put<uint64_t>(&v, 1ull << 50);
    b.Kv("tokenizer.ggml.tokens", kArr, v);
    return b.Build();
  }, loss, {"'tokenizer.ggml.tokens'", "array of 1125899906842624"});
  add("bool that is 2", [] { Builder b = TinyLlama(); b.Kv("x.flag", kBool, std::string(1, 2)); return b.Build(); }, loss, {"'x.flag'", "bool value 2"});
  add("duplicate key", [] { Builder b = TinyLlama(); b.U32("llama.block_count", 2); return b.Build(); }, loss, {"duplicate metadata key 'llama.block_count'"});
  add("alignment not a power of two", [] { Builder b = TinyLlama(); b.U32("general.alignment", 48); return b.Build(); }, loss, {"'general.alignment' is 48"});
  add("alignment mistyped", [] { Builder b = TinyLlama(); b.Str("general.alignment", "32"); return b.Build(); }, loss, {"'general.alignment' must be uint32, got string"});
  add("tensor of rank 0", [] { Builder b = TinyLlama(); b.tensors[1].dims = {}; return b.Build(); }, loss, {"tensor 'blk.0.attn_norm.weight'", "rank 0"});
  add("tensor of rank 5", [] { Builder b = TinyLlama(); b.tensors[1].dims = {2, 2, 2, 2, 2}; return b.Build(); }, loss, {"tensor 'blk.0.attn_norm.weight'", "rank 5"});
  add("tensor dim of 0", [] { Builder b = TinyLlama(); b.tensors[2].dims = {kHidden, 0}; return b.Build(); }, loss, {"tensor 'blk.0.attn_q.weight'", "dim 1 is 0"});
  add("unknown ggml type", [] { Builder b = TinyLlama(); b.tensors[3].type = 99; return b.Build(); }, C::kInvalidArgument, {"tensor 'blk.0.attn_k.weight'", "ggml type 99"});
  add("row not a whole number of blocks", [] {
    Builder b = TinyLlama();
    b.tensors[1].type = 8;  // Q8_0 needs rows of 32k elements
    b.tensors[1].dims = {33};
    return b.Build();
  }, loss, {"tensor 'blk.0.attn_norm.weight'", "row length 33", "Q8_0"});
  add("misaligned offset", [] { Builder b = TinyLlama(); b.tensors[2].offset = 1028; return b.Build(); }, loss, {"tensor 'blk.0.attn_q.weight'", "offset 1028", "alignment 32"});
  add("data cut short", [valid] { return Cut(valid, valid.size() - 100); }, loss, {"tensor 'output_norm.weight'", "runs past the end of the file"});
  add("overlapping tensors", [] { Builder b = TinyLlama(); b.tensors[4].offset = 0; return b.Build(); }, loss, {"overlaps tensor"});
  add("duplicate tensor name", [] { Builder b = TinyLlama(); b.tensors[3].name = b.tensors[2].name; return b.Build(); }, loss, {"duplicate tensor 'blk.0.attn_q.weight'"});
  add("cut in the tensor infos", [] {
    Builder b = TinyLlama();
    std::string s = b.Build();
    const size_t at = s.find("blk.0.attn_k.weight");
    return Cut(s, at + 19 + 6);
  }, loss, {"tensor 'blk.0.attn_k.weight'", "truncated"});
  add("arrays nested too deep", [] {
    Builder b;
    std::string v;
    for (int i = 0; i < 6; ++i) {
      Put<uint32_t>(&v, kArr);
      Put<uint64_t>(&v, 1);
    }
    Put<uint32_t>(&v, kU8);
    Put<uint64_t>(&v, 0);
    b.Kv("x.nested", kArr, v);
    return b.Build();
  }, loss, {"'x.nested'", "nested deeper"});
  // Files that parse but do not make a llama model.
  add("missing block_count", [] {
    Builder b = TinyLlama();
    b.kvs.erase(b.kvs.begin() + 4);
    return b.Build();
  }, C::kInvalidArgument, {"missing required metadata key 'llama.block_count'"}, true);
  add("embedding_length mistyped", [] {
    Builder b = TinyLlama();
    b.kvs.erase(b.kvs.begin() + 3);
    b.Str("llama.embedding_length", "32");
    return b.Build();
  }, C::kInvalidArgument, {"'llama.embedding_length' must be an integer, got string"}, true);
  add("architecture not llama", [] {
    Builder b = TinyLlama();
    b.kvs.erase(b.kvs.begin());
    b.Str("general.architecture", "gpt2");
    return b.Build();
  }, C::kInvalidArgument, {"'general.architecture' is 'gpt2'"}, true);
  add("tensor shape against the config", [] {
    Builder b = TinyLlama();
    b.tensors[2].dims = {kHidden, kHeads * kHeadDim - 8};
    b.tensors[2].data.resize(kHidden * (kHeads * kHeadDim - 8) * 4);
    return b.Build();
  }, C::kInvalidArgument, {"tensor 'blk.0.attn_q.weight'", "expected shape [32, 32] from the config, found [24, 32]"}, true);
  add("missing tensor", [] {
    Builder b = TinyLlama();
    b.tensors.erase(b.tensors.begin() + 9);
    return b.Build();
  }, C::kInvalidArgument, {"tensor 'blk.0.ffn_down.weight' is missing"}, true);
  add("weight type kvmesh cannot dequantize", [] {
    Builder b = TinyLlama();
    Tensor& t = b.tensors[1];  // attn_norm [32] as one Q5_0 block: a known layout, not dequantized
    t.type = 6;
    t.data.assign(22, 0);
    return b.Build();
  }, C::kInvalidArgument, {"tensor 'blk.0.attn_norm.weight'", "ggml type Q5_0 is not supported"}, true);
  add("kv heads do not divide heads", [] {
    Builder b = TinyLlama();
    b.kvs.erase(b.kvs.begin() + 7);
    b.U32("llama.attention.head_count_kv", 3);
    return b.Build();
  }, C::kInvalidArgument, {"'llama.attention.head_count_kv'", "must divide"}, true);
  return cases;
}

TEST(GgufCorruptFileTest, EachCorruptOrTruncatedFileIsRefusedWithAClearError) {
  int refused = 0;
  const std::vector<CorruptCase> cases = CorruptCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const CorruptCase& c = cases[i];
    const std::string path = WriteTemp("corrupt-" + std::to_string(i) + ".gguf", c.bytes());
    absl::Status status;
    if (c.load_model) {
      ASSERT_TRUE(GgufFile::Open(path).ok()) << c.name << ": the file itself should parse";
      status = LoadGgufModel(path).status();
    } else {
      status = GgufFile::Open(path).status();  // through mmap
      const std::string bytes = c.bytes();
      EXPECT_EQ(Parse(bytes).status().code(), status.code()) << c.name;
    }
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    bool names_it = true;
    for (const std::string& s : c.says) {
      if (status.message().find(s) == std::string::npos) {
        names_it = false;
        ADD_FAILURE() << c.name << ": error \"" << status.message() << "\" does not say \"" << s << "\"";
      }
    }
    EXPECT_NE(status.message().find(path), std::string::npos) << c.name << " names the file: " << status;
    if (!status.ok() && names_it) ++refused;
  }
  std::printf("%d of %zu corrupt or truncated GGUF files refused with a clear error\n", refused, cases.size());
  EXPECT_EQ(refused, static_cast<int>(cases.size()));
  EXPECT_GE(refused, 20);
}

TEST(GgufCorruptFileTest, EveryTruncationOfAValidFileIsRefused) {
  // Every prefix shorter than the file fails cleanly (no crash, no success).
  const std::string valid = TinyLlama().Build();
  int refused = 0;
  for (size_t n = 0; n < valid.size(); n += 7) {
    const std::string cut = Cut(valid, n);
    if (!Parse(cut).ok()) ++refused;
  }
  EXPECT_EQ(refused, static_cast<int>((valid.size() + 6) / 7));
}

TEST(GgufFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(GgufFile::Open("/nonexistent/x.gguf").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsGgufPath("a/b.GGUF"));
  EXPECT_FALSE(IsGgufPath("a/b"));
}

}  // namespace
}  // namespace kvmesh::model
