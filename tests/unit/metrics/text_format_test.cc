#include "metrics/text_format.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace kvmesh::metrics {
namespace {

std::string Double(double v) {
  std::string out;
  AppendDouble(v, &out);
  return out;
}

TEST(TextFormatTest, MetricNamesFollowTheDataModel) {
  for (const char* name : {"a", "_a", ":a", "kvmesh_requests_total", "job:rate5m", "A9_:b"}) {
    EXPECT_TRUE(IsValidMetricName(name)) << name;
    EXPECT_TRUE(ValidateMetricName(name).ok()) << name;
  }
  for (const char* name : {"", "9a", "a-b", "a b", "a.b", "é", "a\n"}) {
    EXPECT_FALSE(IsValidMetricName(name)) << name;
    EXPECT_EQ(ValidateMetricName(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(TextFormatTest, LabelNamesFollowTheDataModelAndReserveDoubleUnderscore) {
  for (const char* name : {"a", "_a", "model", "A_9"}) EXPECT_TRUE(ValidateLabelName(name).ok()) << name;
  for (const char* name : {"", "9a", "a:b", "a-b", "__name__", "__x"}) {
    EXPECT_EQ(ValidateLabelName(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_TRUE(IsValidLabelName("__x"));  // Syntax only.
}

TEST(TextFormatTest, LabelValuesEscapeBackslashQuoteAndNewline) {
  std::string out;
  AppendEscapedLabelValue("a\\b\"c\nd\te", &out);
  EXPECT_EQ(out, "a\\\\b\\\"c\\nd\te");
}

TEST(TextFormatTest, HelpEscapesBackslashAndNewlineButNotQuotes) {
  std::string out;
  AppendEscapedHelp("say \"hi\"\\\nbye", &out);
  EXPECT_EQ(out, "say \"hi\"\\\\\\nbye");
}

TEST(TextFormatTest, DoublesRoundTripInPrometheusForms) {
  EXPECT_EQ(Double(0), "0");
  EXPECT_EQ(Double(-0.0), "0");
  EXPECT_EQ(Double(3), "3");
  EXPECT_EQ(Double(-42), "-42");
  EXPECT_EQ(Double(1000000), "1000000");
  EXPECT_EQ(Double(0.25), "0.25");
  EXPECT_EQ(Double(0.001), "0.001");
  EXPECT_EQ(Double(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(Double(2.5e-6), "2.5e-06");
  EXPECT_EQ(Double(1.5e20), "1.5e+20");
  EXPECT_EQ(Double(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(Double(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(Double(std::nan("")), "NaN");
  for (double v : {1e-300, 123.456, 9007199254740993.0, 1e15 + 0.5, 1.0 / 3, -7.25e-5}) {
    EXPECT_EQ(std::stod(Double(v)), v) << Double(v);
  }
}

TEST(TextFormatTest, Utf8ValidationRejectsMalformedSequences) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // Truncated.
  EXPECT_FALSE(IsValidUtf8("\x80"));              // Lone continuation byte.
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // Overlong '/'.
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // UTF-16 surrogate.
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // Beyond U+10FFFF.
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(TextFormatTest, ContentTypeIsVersion004) {
  EXPECT_EQ(kExpositionContentType, "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace
}  // namespace kvmesh::metrics
