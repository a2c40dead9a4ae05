#include "core/logging.h"

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(LoggingTest, ParsesLevels) {
  LogLevel level = LogLevel::kInfo;
  EXPECT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  EXPECT_TRUE(ParseLogLevel("error", &level));
  EXPECT_EQ(level, LogLevel::kError);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
  EXPECT_EQ(level, LogLevel::kError);
}

TEST(LoggingTest, KvFieldsQuoteSpacesAndEscapeQuotes) {
  EXPECT_EQ(LogKv("n", 3).text, "n=3");
  EXPECT_EQ(LogKv("path", std::string("a b")).text, "path=\"a b\"");
  EXPECT_EQ(LogKv("q", std::string("say \"hi\"")).text, "q=\"say \\\"hi\\\"\"");
}

TEST(LoggingTest, LinesBelowThresholdAreNotEvaluated) {
  SetLogLevel(LogLevel::kError);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  KVMESH_LOG(kInfo) << count();
  EXPECT_EQ(evaluated, 0);
  testing::internal::CaptureStderr();
  KVMESH_LOG(kError) << "boom" << LogKv("code", count());
  const std::string line = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_NE(line.find("ERROR logging_test.cc:"), std::string::npos) << line;
  EXPECT_NE(line.find("boom code=1"), std::string::npos) << line;
  SetLogLevel(LogLevel::kInfo);
}

}  // namespace
}  // namespace kvmesh
