// Regression tests for libs/model/internal/utf8.h found by tests/fuzz.
#include "model/internal/utf8.h"

#include <string>

#include <gtest/gtest.h>

#include "model/chat_template.h"

namespace kvmesh::model {
namespace {

TEST(Utf8Test, DecodeUtf8OfTruncatedOrInvalidInputIsReplacementWithinTheString) {
  for (const std::string& s : {std::string("\xF0"), std::string("\xE2\x82"), std::string("\xC3"),
                              std::string("\xF0\x9F\x98"), std::string("\x80"), std::string("\xFF")}) {
    size_t pos = 0;
    EXPECT_EQ(internal::DecodeUtf8(s, &pos), char32_t{0xFFFD});
    EXPECT_GE(pos, 1u);
    EXPECT_LE(pos, s.size());
  }
  const std::string euro = "\xE2\x82\xAC";
  size_t pos = 0;
  EXPECT_EQ(internal::DecodeUtf8(euro, &pos), char32_t{0x20AC});
  EXPECT_EQ(pos, 3u);
}

// tests/fuzz/corpus/chat_template/regress-truncated-utf8-trim: llama3's `trim` of a
// message ending in a lone UTF-8 lead byte read past the message.
TEST(Utf8Test, ChatTemplateTrimOfAMessageEndingInALoneLeadByte) {
  const ChatTemplate llama3 = ChatTemplate::FromName("llama3").value();
  const absl::StatusOr<std::string> text = llama3.Apply({{"user", "hi \xF0"}}, true, "<s>");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("hi"), std::string::npos);
}

}  // namespace
}  // namespace kvmesh::model
