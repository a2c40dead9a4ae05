#include "serving/request_ids.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

namespace kvmesh::serving {
namespace {

TEST(RequestIdsTest, IdsArePrefixPlus32HexDigitsAndDoNotRepeatAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 5000;
  std::vector<std::vector<std::string>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&drawn, t] {
      for (int i = 0; i < kPerThread; ++i) drawn[t].push_back(NewResponseId("cmpl-"));
    });
  }
  for (std::thread& t : threads) t.join();
  absl::flat_hash_set<std::string> seen;
  for (const auto& ids : drawn) {
    for (const std::string& id : ids) {
      ASSERT_EQ(id.size(), 5u + 32u) << id;
      EXPECT_EQ(id.substr(0, 5), "cmpl-");
      EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
      EXPECT_TRUE(seen.insert(id).second) << "repeated " << id;
    }
  }
}

TEST(RequestIdsTest, UnixSecondsNowIsAfter2024) {
  EXPECT_GT(UnixSecondsNow(), int64_t{1704067200});
}

}  // namespace
}  // namespace kvmesh::serving
