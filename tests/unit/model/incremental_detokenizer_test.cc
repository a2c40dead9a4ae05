// IncrementalDetokenizer: pieces never split a UTF-8 character, and all pieces
// plus Flush() equal Decode(all ids). (tokenizer_parity_test.cc also streams
// every fixture through it.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "tokenizer_test_util.h"

namespace kvmesh::model {
namespace {

std::unique_ptr<Tokenizer> LoadJson(const std::string& dir) {
  std::string text;
  if (!testing::ReadFile(dir + "/tokenizer.json", &text)) return nullptr;
  auto tok = Tokenizer::FromJson(text, dir + "/tokenizer.json");
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::unique_ptr<Tokenizer> LoadSentencePiece() {
  std::string bytes;
  const std::string path = testing::RepoFixtureDir() + "/sp-bpe-tiny.model";
  if (!testing::ReadFile(path, &bytes)) return nullptr;
  auto tok = Tokenizer::FromSentencePieceModel(bytes, path);
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// Streams `ids` and returns the pieces (Flush() last).
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer detok(tok, skip);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(detok.Append(id));
  pieces.push_back(detok.Flush());
  return pieces;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

TEST(IncrementalDetokenizerTest, ByteFallbackCharacterIsHeldUntilComplete) {
  auto tok = LoadSentencePiece();
  ASSERT_NE(tok, nullptr);
  // U+9F98 is not in the tiny model: three <0xNN> byte tokens.
  const std::string text = "hi \xE9\xBE\x98 there";
  const auto ids = tok->Encode(text, false);
  const auto pieces = Stream(*tok, ids, false);
  EXPECT_EQ(Join(pieces), text);
  EXPECT_EQ(Join(pieces), tok->Decode(ids, false));
  size_t byte_tokens = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (tok->IdToToken(ids[i]).rfind("<0x", 0) == 0) {
      ++byte_tokens;
      // Byte tokens emit nothing: a later byte could still turn the run into U+FFFDs.
      EXPECT_EQ(pieces[i], "") << i;
    } else if (byte_tokens == 3) {
      // The first token after the run releases the character.
      EXPECT_EQ(pieces[i].find("\xE9\xBE\x98"), 0u) << i;
      byte_tokens = 4;
    }
  }
  EXPECT_EQ(byte_tokens, 4u);
}

TEST(IncrementalDetokenizerTest, SentencePieceLeadingSpaceIsNotEmittedTwice) {
  auto tok = LoadSentencePiece();
  ASSERT_NE(tok, nullptr);
  const std::string text = "the quick brown fox";
  const auto ids = tok->Encode(text, true);
  EXPECT_EQ(Join(Stream(*tok, ids, true)), text);
  EXPECT_EQ(Join(Stream(*tok, ids, false)), tok->Decode(ids, false));
}

TEST(IncrementalDetokenizerTest, EmojiSplitAcrossByteLevelTokens) {
  auto tok = LoadJson(testing::TokenizerDataDir() + "/gpt2");
  ASSERT_NE(tok, nullptr) << "tests/data/tokenizers/gpt2/tokenizer.json did not load";
  // ZWJ family emoji: many byte-level tokens, most ending mid-character.
  const std::string text = "family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok \xF0\x9F\xA6\x99";
  const auto ids = tok->Encode(text, false);
  ASSERT_GT(ids.size(), 8u);
  const auto pieces = Stream(*tok, ids, false);
  EXPECT_EQ(Join(pieces), text);
  for (const std::string& p : pieces) {
    EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << "emitted a replacement character";
  }
}

TEST(IncrementalDetokenizerTest, MistralByteFallbackAndSpecialTokens) {
  auto tok = LoadJson(testing::TokenizerDataDir() + "/mistral-7b");
  ASSERT_NE(tok, nullptr) << "tests/data/tokenizers/mistral-7b/tokenizer.json did not load";
  const std::string text = "Hi \xF0\x9F\xA6\x99 and \xE2\x82\xAC" "5</s> next";
  auto ids = tok->Encode(text, true);
  for (bool skip : {false, true}) {
    const auto pieces = Stream(*tok, ids, skip);
    EXPECT_EQ(Join(pieces), tok->Decode(ids, skip)) << skip;
    for (const std::string& p : pieces) EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos);
  }
}

TEST(IncrementalDetokenizerTest, DanglingBytesAreFlushedAsReplacementCharacter) {
  auto tok = LoadJson(testing::TokenizerDataDir() + "/mistral-7b");
  ASSERT_NE(tok, nullptr) << "tests/data/tokenizers/mistral-7b/tokenizer.json did not load";
  // "<0xF0>" "<0x9F>": the first half of an emoji; never completed.
  const std::vector<int32_t> ids = {*tok->TokenToId("▁Hello"), *tok->TokenToId("<0xF0>"), *tok->TokenToId("<0x9F>")};
  IncrementalDetokenizer detok(*tok, true);
  EXPECT_EQ(detok.Append(ids[0]), "Hello");
  EXPECT_EQ(detok.Append(ids[1]), "");
  EXPECT_EQ(detok.Append(ids[2]), "");
  EXPECT_EQ(detok.Flush(), tok->Decode(ids, true).substr(5));
  EXPECT_EQ(tok->Decode(ids, true), "Hello\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizerTest, EmptyStreamFlushesNothing) {
  auto tok = LoadSentencePiece();
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok, true);
  EXPECT_EQ(detok.Flush(), "");
}

}  // namespace
}  // namespace kvmesh::model
