#include "core/api_key.h"

#include <gtest/gtest.h>

namespace kvmesh {
namespace {

TEST(ApiKeyTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret1", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(ApiKeyTest, MatchBearerKeyReturnsTheMatchingKey) {
  const std::vector<std::string> keys = {"k1", "k2"};
  EXPECT_EQ(MatchBearerKey("Bearer k2", keys), "k2");
  EXPECT_EQ(MatchBearerKey("Bearer k3", keys), std::nullopt);
  EXPECT_EQ(MatchBearerKey("k1", keys), std::nullopt);
  EXPECT_EQ(MatchBearerKey("Basic k1", keys), std::nullopt);
}

}  // namespace
}  // namespace kvmesh
