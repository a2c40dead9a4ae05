#include "metrics/family.h"

#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/registry.h"

namespace kvmesh::metrics {
namespace {

TEST(FamilyTest, WithLabelsReturnsTheSameChildForEqualValues) {
  Registry registry;
  CounterFamily* family = registry.AddCounterFamily("requests", "Requests.", {"model", "status"}).value();
  Counter* a = family->WithLabels({"tiny", "ok"}).value();
  Counter* b = family->WithLabels({"tiny", "error"}).value();
  const std::string model = "tiny";  // Not the same storage as the literal.
  const std::vector<std::string_view> values = {model, "ok"};
  EXPECT_EQ(family->WithLabels(values).value(), a);
  EXPECT_NE(a, b);
  EXPECT_EQ(family->num_children(), 2u);
  a->Increment(3);
  EXPECT_EQ(family->WithLabels({"tiny", "ok"}).value()->Value(), 3);
}

TEST(FamilyTest, WrongNumberOfLabelValuesIsInvalidArgument) {
  Registry registry;
  GaugeFamily* family = registry.AddGaugeFamily("queue_depth", "Depth.", {"queue"}).value();
  EXPECT_EQ(family->WithLabels({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->WithLabels({"a", "b"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->num_children(), 0u);
}

TEST(FamilyTest, LabelValuesMustBeUtf8ButMayHoldAnythingElse) {
  Registry registry;
  GaugeFamily* family = registry.AddGaugeFamily("g", "G.", {"v"}).value();
  EXPECT_EQ(family->WithLabels({"\xFF"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(family->WithLabels({""}).ok());
  EXPECT_TRUE(family->WithLabels({"quote\" backslash\\ newline\n caf\xC3\xA9"}).ok());
}

TEST(FamilyTest, ConcurrentWithLabelsCreatesOneChildPerValue) {
  Registry registry;
  CounterFamily* family = registry.AddCounterFamily("c", "C.", {"shard"}).value();
  constexpr int kThreads = 8;
  constexpr int kShards = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([family] {
      for (int s = 0; s < kShards; ++s) family->WithLabels({std::to_string(s)}).value()->Increment();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(family->num_children(), size_t{kShards});
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(family->WithLabels({std::to_string(s)}).value()->Value(), kThreads);
}

}  // namespace
}  // namespace kvmesh::metrics
