// Tokenizer loading and error paths, plus behaviours pinned by hand (the bulk
// of the parity checks lives in tokenizer_parity_test.cc).
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tokenizer_test_util.h"

namespace kvmesh::model {
namespace {

using testing::FixtureDir;
using testing::ReadFile;

// A tiny byte-level BPE tokenizer.json: the 256 byte characters, a few merges,
// two special tokens, GPT-2 pre-tokenizer.
std::string TinyByteLevelJson(const std::string& merges_json = R"(["h e", "l l", "he ll", "hell o"])",
                              const std::string& model_type = R"("type": "BPE",)") {
  std::string vocab = "{";
  // GPT-2's byte -> character table, spelled out for the 256 bytes.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next++;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "\"\\u%04x\": %d,", cp, b);
    vocab += buf;
  }
  vocab += R"("he": 256, "ll": 257, "hell": 258, "hello": 259})";
  return R"({"version": "1.0", "added_tokens": [
      {"id": 260, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 261, "content": "<tool>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [260], "tokens": ["<|end|>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {)" +
         model_type + R"( "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
      "vocab": )" + vocab +
         R"(, "merges": )" + merges_json + "}}";
}

// TinyByteLevelJson() with the first `from` replaced by `to` (one field changed).
std::string TinyByteLevelJsonWith(const std::string& from, const std::string& to) {
  std::string s = TinyByteLevelJson();
  s.replace(s.find(from), from.size(), to);
  return s;
}

TEST(TokenizerTest, TinyByteLevelEncodesWithMergesAndSpecialTokens) {
  auto tok = Tokenizer::FromJson(TinyByteLevelJson(), "tiny.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("hello", false), (std::vector<int32_t>{259}));
  EXPECT_EQ((*tok)->Encode("hello", true), (std::vector<int32_t>{260, 259}));
  EXPECT_EQ((*tok)->Encode("hello<|end|>hello<tool>", false), (std::vector<int32_t>{259, 260, 259, 261}));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{259, 260, 261}, false), "hello<|end|><tool>");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{259, 260, 261}, true), "hello<tool>");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{259, 99999, -1}, true), "hello");  // out of range: skipped
  EXPECT_TRUE((*tok)->IsSpecial(260));
  EXPECT_FALSE((*tok)->IsSpecial(261));
  EXPECT_EQ((*tok)->vocab_size(), 262);
  EXPECT_EQ((*tok)->TokenToId("<tool>"), 261);
  EXPECT_EQ((*tok)->IdToToken(259), "hello");
  EXPECT_EQ((*tok)->IdToToken(5000), "");
  EXPECT_EQ((*tok)->bos_token_id(), 260);  // from the post-processor
}

TEST(TokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  auto tok = Tokenizer::FromJson(TinyByteLevelJson(), "tiny.json");
  ASSERT_TRUE(tok.ok());
  // Each maximal invalid subpart is one U+FFFD (EF BF BD), as Python's errors='replace'.
  EXPECT_EQ((*tok)->Encode("a\xE2\x82" "b", false), (*tok)->Encode("a\xEF\xBF\xBD" "b", false));
  EXPECT_EQ((*tok)->Encode("\xF0\x80", false), (*tok)->Encode("\xEF\xBF\xBD\xEF\xBF\xBD", false));
}

void ExpectInvalid(const absl::StatusOr<std::unique_ptr<Tokenizer>>& result, const std::string& path,
                   const std::string& what) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), path)) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), what)) << result.status();
}

// TinyByteLevelJsonWith(from, to) fails to load, naming the file and `what`.
void ExpectTinyJsonWithIsInvalid(const std::string& from, const std::string& to, const std::string& what) {
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJsonWith(from, to), "/m/t.json"), "/m/t.json", what);
}

TEST(TokenizerTest, MalformedJsonIsInvalidArgumentNamingTheFile) {
  ExpectInvalid(Tokenizer::FromJson("{\"model\": ", "/m/tokenizer.json"), "/m/tokenizer.json", "malformed");
  ExpectInvalid(Tokenizer::FromJson("", "/m/tokenizer.json"), "/m/tokenizer.json", "malformed");
  ExpectInvalid(Tokenizer::FromJson("[1, 2]", "/m/tokenizer.json"), "/m/tokenizer.json", "not a JSON object");
}

TEST(TokenizerTest, MissingModelIsInvalidArgument) {
  ExpectInvalid(Tokenizer::FromJson(R"({"version": "1.0", "added_tokens": []})", "/m/tokenizer.json"),
                "/m/tokenizer.json", "model");
}

TEST(TokenizerTest, UnknownModelTypeIsInvalidArgument) {
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJson("[]", R"("type": "Unigram",)"), "/m/t.json"), "/m/t.json",
                "Unigram");
  ExpectInvalid(Tokenizer::FromJson(R"({"model": {"type": "WordPiece", "vocab": {}}})", "/m/t.json"), "/m/t.json",
                "WordPiece");
}

TEST(TokenizerTest, MergeWithUnknownTokenIsInvalidArgument) {
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJson(R"(["h e", "zz q"])"), "/m/t.json"), "/m/t.json", "zz q");
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJson(R"(["h e", "x y"])"), "/m/t.json"), "/m/t.json", "xy");
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJson(R"(["hello"])"), "/m/t.json"), "/m/t.json", "merge 0");
  ExpectInvalid(Tokenizer::FromJson(TinyByteLevelJson(R"([["h", "e"], 7])"), "/m/t.json"), "/m/t.json", "merge 1");
}

TEST(TokenizerTest, UnsupportedComponentsAreInvalidArgumentNamingThem) {
  ExpectTinyJsonWithIsInvalid(R"("normalizer": null)", R"("normalizer": {"type": "NFKC"})", "normalizer 'NFKC'");
  ExpectTinyJsonWithIsInvalid(R"("pre_tokenizer": {"type": "ByteLevel")",
                              R"("pre_tokenizer": {"type": "BertPreTokenizer")", "pre_tokenizer 'BertPreTokenizer'");
  ExpectTinyJsonWithIsInvalid(R"("decoder": {"type": "ByteLevel")", R"("decoder": {"type": "WordPiece")",
                              "decoder 'WordPiece'");
  ExpectTinyJsonWithIsInvalid(R"("post_processor": {"type": "TemplateProcessing")",
                              R"("post_processor": {"type": "Fancy")", "post_processor 'Fancy'");
  ExpectTinyJsonWithIsInvalid(R"("dropout": null)", R"("dropout": 0.1)", "dropout");
  ExpectTinyJsonWithIsInvalid(
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})",
      R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false})",
      "(unclosed");
  // A field of the wrong type is an error, not an exception.
  ExpectTinyJsonWithIsInvalid(R"("fuse_unk": false)", R"("fuse_unk": "yes")", "malformed");
}

// A token id that is a float, negative or past int32 is an error; a float
// such as 1e300 used to be cast to int (undefined behaviour; found by
// tools/fuzz tokenizer_json).
TEST(TokenizerTest, TokenIdsMustBeInt32Integers) {
  for (const char* bad : {"1e300", "2.5", "-3", "4294967296", "18446744073709551615"}) {
    SCOPED_TRACE(bad);
    ExpectTinyJsonWithIsInvalid(R"("id": 260)", absl::StrCat(R"("id": )", bad), "added_tokens id");
    ExpectTinyJsonWithIsInvalid(R"("hello": 259)", absl::StrCat(R"("hello": )", bad), "model.vocab['hello']");
    ExpectTinyJsonWithIsInvalid(R"("ids": [260])", absl::StrCat(R"("ids": [)", bad, "]"), "TemplateProcessing");
  }
}

// The id table is indexed by id: an id in the billions used to allocate
// ~47 GB and abort (found by tools/fuzz tokenizer_json in CI). The largest id
// allowed still loads.
TEST(TokenizerTest, TokenIdsPastTheLargestAllowedAreInvalidArgument) {
  const auto with_hello_id = [](int64_t id) {
    return TinyByteLevelJsonWith(R"("hello": 259)", absl::StrCat(R"("hello": )", id));
  };
  for (int64_t bad : {int64_t{1} << 22, int64_t{1'465'000'000}, int64_t{2'147'483'647}}) {
    SCOPED_TRACE(bad);
    ExpectInvalid(Tokenizer::FromJson(with_hello_id(bad), "/m/t.json"), "/m/t.json", "past the largest token id");
  }
  auto largest = Tokenizer::FromJson(with_hello_id((int64_t{1} << 22) - 1), "/m/t.json");
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ((*largest)->Encode("hello", /*add_special_tokens=*/false), std::vector<int32_t>{(1 << 22) - 1});
}

TEST(TokenizerTest, SentencePieceModelLoadsAndMatchesKnownIds) {
  const std::string path = testing::RepoFixtureDir() + "/sp-bpe-tiny.model";
  std::string bytes;
  ASSERT_TRUE(ReadFile(path, &bytes));
  auto tok = Tokenizer::FromSentencePieceModel(bytes, path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_token_id(), 1);
  EXPECT_EQ((*tok)->eos_token_id(), 2);
  const auto ids = (*tok)->Encode("hello world", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ((*tok)->Decode(ids, true), "hello world");
  // Control symbols in the text are matched as tokens (the Tokenizer contract).
  const auto with_eos = (*tok)->Encode("hi</s>", false);
  EXPECT_EQ(with_eos.back(), 2);
  // Characters outside the vocabulary fall back to bytes.
  const auto cjk = (*tok)->Encode("\xE9\xBE\x98", false);  // U+9F98, not in the training corpus
  EXPECT_EQ((*tok)->Decode(cjk, false), "\xE9\xBE\x98");
  EXPECT_EQ((*tok)->IdToToken(cjk.back()).substr(0, 3), "<0x");
}

TEST(TokenizerTest, TruncatedSentencePieceModelIsDataLossNamingTheFile) {
  std::string bytes;
  ASSERT_TRUE(ReadFile(testing::RepoFixtureDir() + "/sp-bpe-tiny.model", &bytes));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    auto tok = Tokenizer::FromSentencePieceModel(bytes.substr(0, cut), "/m/tokenizer.model");
    ASSERT_FALSE(tok.ok()) << "cut at " << cut;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss) << tok.status();
    EXPECT_TRUE(absl::StrContains(tok.status().message(), "/m/tokenizer.model")) << tok.status();
  }
  // Garbage: a wire type that does not exist.
  auto garbage = Tokenizer::FromSentencePieceModel(std::string("\x0f\x01\x02", 3), "/m/tokenizer.model");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss);
  // A JSON file given as a model.
  auto json = Tokenizer::FromSentencePieceModel("{\"model\": {}}", "/m/tokenizer.model");
  EXPECT_FALSE(json.ok());
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() / ("kvmesh_tok_" + std::to_string(::getpid()) + "_" +
                                                     std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  void Write(const std::string& name, const std::string& contents) const {
    std::ofstream(path_ / name, std::ios::binary) << contents;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(TokenizerTest, FromDirectoryReadsConfigForBosEosAndAddBos) {
  TempDir dir;
  std::string model;
  ASSERT_TRUE(ReadFile(testing::RepoFixtureDir() + "/sp-bpe-tiny.model", &model));
  dir.Write("tokenizer.model", model);
  dir.Write("tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true, "bos_token": "<s>",
                                         "eos_token": {"content": "</s>"}})");
  auto tok = Tokenizer::FromDirectory(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_token_id(), 1);
  EXPECT_EQ((*tok)->eos_token_id(), 2);
  const auto ids = (*tok)->Encode("hello", true);
  EXPECT_NE(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
}

TEST(TokenizerTest, FromDirectoryPrefersTokenizerJson) {
  TempDir dir;
  dir.Write("tokenizer.json", TinyByteLevelJson());
  dir.Write("tokenizer.model", "not a model");
  auto tok = Tokenizer::FromDirectory(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("hello", false), (std::vector<int32_t>{259}));
}

TEST(TokenizerTest, FromDirectoryErrorsNameTheFile) {
  TempDir empty;
  EXPECT_EQ(Tokenizer::FromDirectory(empty.path()).status().code(), absl::StatusCode::kNotFound);
  TempDir bad_json;
  bad_json.Write("tokenizer.json", "{not json");
  ExpectInvalid(Tokenizer::FromDirectory(bad_json.path()), bad_json.path() + "/tokenizer.json", "malformed");
  TempDir bad_model;
  bad_model.Write("tokenizer.model", std::string("\x0a\xff\xff", 3));
  auto tok = Tokenizer::FromDirectory(bad_model.path());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(tok.status().message(), bad_model.path() + "/tokenizer.model"));
  TempDir bad_config;
  bad_config.Write("tokenizer.json", TinyByteLevelJson());
  bad_config.Write("tokenizer_config.json", "{");
  ExpectInvalid(Tokenizer::FromDirectory(bad_config.path()), bad_config.path() + "/tokenizer_config.json",
                "malformed");
}

TEST(TokenizerTest, MistralFromDirectoryUsesConfigTokens) {
  const std::string dir = testing::TokenizerDataDir() + "/mistral-7b";
  auto tok = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_token_id(), 1);
  EXPECT_EQ((*tok)->eos_token_id(), 2);
  EXPECT_EQ((*tok)->Encode("Hello", true).front(), 1);
  EXPECT_EQ((*tok)->vocab_size(), 32000);
}

TEST(TokenizerTest, Gpt2FromDirectoryFindsEndOfText) {
  const std::string dir = testing::TokenizerDataDir() + "/gpt2";
  auto tok = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_token_id(), 50256);
  EXPECT_EQ((*tok)->vocab_size(), 50257);
}

TEST(TokenizerTest, TinyModelDirectoryLoads) {
  const std::string dir = KVMESH_TINY_MODEL_DIR;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << dir << " is not built";
  auto tok = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_TRUE((*tok)->bos_token_id().has_value());
  EXPECT_EQ((*tok)->Encode("hi", true).front(), *(*tok)->bos_token_id());
  ASSERT_TRUE((*tok)->eos_token_id().has_value());
}

}  // namespace
}  // namespace kvmesh::model
