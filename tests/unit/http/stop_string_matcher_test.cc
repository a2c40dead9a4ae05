#include "http/stop_string_matcher.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvmesh::http {
namespace {

// Feeds `pieces` and returns everything emitted (Flush included unless stopped).
std::string Feed(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.Consume(p);
    out += r.text;
    if (r.stopped) return out;
  }
  return out + m.Flush();
}

TEST(StopStringMatcherTest, NoStopStringsPassesEverythingThrough) {
  StopStringMatcher m({});
  auto r = m.Consume("hello");
  EXPECT_EQ(r.text, "hello");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcherTest, StopInsideOnePieceEmitsTextBeforeIt) {
  StopStringMatcher m({"###"});
  auto r = m.Consume("abc###def");
  EXPECT_EQ(r.text, "abc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 0);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Consume("more").text, "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopStringMatcherTest, StopSplitAcrossPiecesIsHeldBackThenDropped) {
  StopStringMatcher m({"STOP"});
  auto r1 = m.Consume("hello S");
  EXPECT_EQ(r1.text, "hello ");
  EXPECT_EQ(m.held_bytes(), 1u);
  auto r2 = m.Consume("T");
  EXPECT_EQ(r2.text, "");
  auto r3 = m.Consume("OP tail");
  EXPECT_EQ(r3.text, "");
  EXPECT_TRUE(r3.stopped);
}

TEST(StopStringMatcherTest, HeldPrefixIsReleasedWhenItStopsMatching) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Consume("xST").text, "x");
  EXPECT_EQ(m.Consume("AR").text, "STAR");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcherTest, FlushReleasesAPartialStopAtTheEnd) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.Consume("end</").text, "end");
  EXPECT_EQ(m.Flush(), "</");
}

TEST(StopStringMatcherTest, OverlappingPrefixesFindTheLaterMatch) {
  // "aab" inside "aaab": the first 'a' could start a match but does not.
  StopStringMatcher m({"aab"});
  EXPECT_EQ(Feed(m, {"a", "a", "a", "b", "c"}), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcherTest, SelfOverlappingStopString) {
  StopStringMatcher m({"abab"});
  EXPECT_EQ(Feed(m, {"ab", "a", "bab"}), "");
  StopStringMatcher m2({"abab"});
  EXPECT_EQ(Feed(m2, {"xaba", "c"}), "xabac");
  EXPECT_FALSE(m2.stopped());
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopStringsWins) {
  StopStringMatcher m({"world", "lo w", "zzz"});
  auto r = m.Consume("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hel");
  EXPECT_EQ(r.stop_index, 1);
}

TEST(StopStringMatcherTest, LongestWinsAtTheSameStart) {
  StopStringMatcher m({"ab", "abc"});
  auto r1 = m.Consume("xabc");
  EXPECT_TRUE(r1.stopped);
  EXPECT_EQ(r1.text, "x");
  EXPECT_EQ(r1.stop_index, 1);
}

TEST(StopStringMatcherTest, HoldsTheLongestPossiblePrefixAmongSeveralStops) {
  StopStringMatcher m({"\nUser:", "\n\n"});
  EXPECT_EQ(m.Consume("answer\nUs").text, "answer");
  EXPECT_EQ(m.held_bytes(), 3u);
  auto r = m.Consume("er: next");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 0);
  EXPECT_EQ(r.text, "");
}

TEST(StopStringMatcherTest, MultiByteStopStringSplitInsideACharacter) {
  const std::string stop = "世界";  // e4 b8 96 e7 95 8c
  StopStringMatcher m({stop});
  auto r1 = m.Consume("你好\xe4\xb8");
  EXPECT_EQ(r1.text, "你好");
  auto r2 = m.Consume("\x96\xe7");
  EXPECT_EQ(r2.text, "");
  auto r3 = m.Consume("\x95\x8c!");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.text, "");
}

TEST(StopStringMatcherTest, NeverEmitsHalfAUtf8Character) {
  StopStringMatcher m({"zz"});
  // "é" = c3 a9 arrives split; the lead byte is held until its continuation comes.
  auto r1 = m.Consume("caf\xc3");
  EXPECT_EQ(r1.text, "caf");
  auto r2 = m.Consume("\xa9 ok");
  EXPECT_EQ(r2.text, "\xc3\xa9 ok");
}

TEST(StopStringMatcherTest, MultiByteTextWithAsciiStop) {
  StopStringMatcher m({"."});
  EXPECT_EQ(Feed(m, {"日本", "語です", "。ok. more"}), "日本語です。ok");
}

TEST(StopStringMatcherTest, EmptyStopStringsAreIgnoredAndIndicesKept) {
  StopStringMatcher m({"", "x"});
  auto r = m.Consume("abxc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 1);
  EXPECT_EQ(r.text, "ab");
}

TEST(StopStringMatcherTest, ByteAtATimeMatchesWholeStringResult) {
  const std::string text = "The answer is 42.\nQ: next question";
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{"\nQ:"}, {"42", "answer"}, {"question"}, {"nothing"}}) {
    StopStringMatcher whole(stops);
    const std::string expected = Feed(whole, {text});
    StopStringMatcher bytewise(stops);
    std::vector<std::string> pieces;
    for (char c : text) pieces.emplace_back(1, c);
    EXPECT_EQ(Feed(bytewise, pieces), expected) << stops[0];
  }
}

}  // namespace
}  // namespace kvmesh::http
